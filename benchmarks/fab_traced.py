"""`fab` with llmfab's transport counted in-process (for the launch suite's round-trip table, benchmarks/suite.py).

    LLMFAB_BENCH_TRACE=out.json python benchmarks/fab_traced.py -S CFG -H h1 deploy ...

Runs Fabric's own `fab` program after wrapping tasks.transport.agent.Host: each SSH connection
opened, each remote command started, each agent request (by op) and each file put is
recorded with its start time and duration (seconds since this process started). At exit
the records go to $LLMFAB_BENCH_TRACE as JSON: {"events": [[t, dt, kind, name, host]],
"imported_at": t, "total": t}. Nothing else changes: the same code runs as under `fab`.
"""
import atexit
import json
import os
import sys
import threading
import time

T0 = time.monotonic()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tasks.transport import agent as transport  # noqa: E402

EVENTS = []
_lock = threading.Lock()


def _wrap(method, kind):
    original = getattr(transport.Host, method)

    def traced(self, *args, **kwargs):
        started = time.monotonic()
        before = dict(self.stats)
        try:
            return original(self, *args, **kwargs)
        finally:
            name = args[0] if kind == "call" and args else ""
            if name == "batch":  # one request holding several ops: named by them
                name = "batch(%s)" % "+".join(c.get("op", "?") for c in kwargs.get("calls", ()))
            if kind == "put":
                name = os.path.basename(args[1]) if len(args) > 1 else ""
            record = [round(started - T0, 4), round(time.monotonic() - started, 4), kind, name,
                      self.name, {k: self.stats[k] - before.get(k, 0) for k in self.stats}]
            with _lock:
                EVENTS.append(record)

    setattr(transport.Host, method, traced)


for _method, _kind in (("connect", "connect"), ("start", "start"), ("call", "call"),
                       ("put", "put")):
    _wrap(_method, _kind)


def _dump():
    path = os.environ.get("LLMFAB_BENCH_TRACE")
    if path:
        with open(path, "w") as f:
            json.dump({"events": sorted(EVENTS), "imported_at": IMPORTED_AT,
                       "total": time.monotonic() - T0}, f)


atexit.register(_dump)

from fabric.main import program  # noqa: E402

IMPORTED_AT = time.monotonic() - T0

if __name__ == "__main__":
    os.chdir(REPO)
    program.run(["fab"] + sys.argv[1:])
