"""The real engine's recorded start-up failures (tests/fixtures/failures/real/) and the profile
that launches each: for tests/unit/test_recorded_failures.py and
tests/real/test_standin_fidelity_real.py."""
import json
from pathlib import Path
from tasks.failures.explain import Readings, explain
from tasks.failures.logscan import LogScanner
from tasks.profile import load_profile


REAL = Path(__file__).with_name("fixtures") / "failures" / "real"


CASES = json.loads((REAL / "cases.json").read_text())


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
