"""A PyTorch stand-in for an LLM server, for the `gpu` suite: real CUDA memory, real processes.

Serve mode (default), shaped like vLLM: the API process allocates --mib MiB on the first
visible GPU, spawns an engine child (multiprocessing "spawn", as vLLM starts EngineCore)
that allocates --mib MiB too and leaves the process group (os.setsid, as a worker that
daemonises would), then serves GET /health (200 while the child lives) and /v1/models
with the standard library's http.server. SIGTERM ends both (default action).

Hold mode (--hold): allocate --mib MiB, ignore SIGTERM, write "<pid>\\n" to --ready-file,
then sleep until killed: the orphan `fab kill-gpu-procs` exists for.

Needs only a Python with PyTorch built for CUDA (LLMFAB_GPU_PYTHON in the suite).
"""
import argparse
import http.server
import json
import multiprocessing
import os
import signal
import sys
import time

MiB = 1 << 20


def allocate(mib):
    import torch
    block = torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")
    block.fill_(1)  # touch every page, so the memory is really in use
    torch.cuda.synchronize()
    return block


def engine_main(mib, ready):
    os.setsid()
    block = allocate(mib)  # noqa: F841 (held until the process dies)
    ready.set()
    while True:
        time.sleep(3600)


def serve(args):
    block = allocate(args.mib)  # noqa: F841
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    engine = ctx.Process(target=engine_main, args=(args.mib, ready), name="EngineCore")
    engine.start()
    if not ready.wait(300):
        sys.exit("engine child did not allocate its memory within 300 s")
    print(f"api pid {os.getpid()} and engine pid {engine.pid} hold {args.mib} MiB each", flush=True)
    models = json.dumps({"object": "list", "data": [{"id": args.served_name, "object": "model"}]}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                code, body = (200, b"ok") if engine.is_alive() else (503, b"engine died")
            elif self.path == "/v1/models":
                code, body = 200, models
            else:
                code, body = 404, b"not found"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


def hold(args):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    block = allocate(args.mib)  # noqa: F841
    with open(args.ready_file + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(args.ready_file + ".tmp", args.ready_file)
    while True:
        time.sleep(3600)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=30517)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--mib", type=int, default=2048)
    p.add_argument("--served-name", default="torch-standin")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--ready-file")
    args = p.parse_args()
    hold(args) if args.hold else serve(args)


if __name__ == "__main__":  # multiprocessing "spawn" re-imports this file
    main()
