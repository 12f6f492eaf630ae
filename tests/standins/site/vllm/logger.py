"""vLLM-style log lines: `(APIServer pid=N) INFO 11-30 04:27:01 [file.py:123] message`."""
import os

from llmfab_standin import demo_server as _out

PROCESS_PREFIX = [""]


def set_process(name, pid=None):
    PROCESS_PREFIX[0] = "(%s pid=%d) " % (name, os.getpid() if pid is None else pid)


def log(message, where, level="INFO", prefix=None):
    _out.log(message, level=level, where=where,
             prefix=PROCESS_PREFIX[0] if prefix is None else prefix)


def lines(prefix, text):
    """Print raw lines (a traceback) each carrying the process prefix."""
    for line in text.splitlines():
        _out.raw(prefix + line)
