"""A server script without the __main__ guard, for `engine = "command"` tests.

The same bug was the second one of the Qwen3.6-27B + DFlash deployment on vLLM 0.20.1 that
llmfab was written after.

It starts its worker process at import time, with no `if __name__ == "__main__":`
guard, under multiprocessing's "spawn" start method (the one vLLM switches to once CUDA
is initialised). The spawned child re-imports this file as `__mp_main__`, reaches the
same `start()` during its bootstrapping phase, and CPython refuses with RuntimeError
"An attempt has been made to start a new process before the current process has
finished its bootstrapping phase" (Lib/multiprocessing/spawn.py). The child dies with
status 1; so does this parent, after joining it. Nothing here is faked.
"""
import multiprocessing
import sys


def worker(port):
    print("worker serving on port %s" % port, flush=True)


ctx = multiprocessing.get_context("spawn")
child = ctx.Process(target=worker, args=(sys.argv[sys.argv.index("--port") + 1]
                                         if "--port" in sys.argv else "?",))
child.start()
print("started worker pid %d" % child.pid, flush=True)
child.join()
sys.exit(1 if child.exitcode else 0)
