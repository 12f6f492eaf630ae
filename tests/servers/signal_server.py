"""A server for tests that counts the signals each of its processes receives.

Run by llmfab as an `engine = "command"` server (shipped via server.files):

    python3 signal_server.py --port N [--linger S]

It starts two children: one stays in the server's process group, the other calls
setsid (like a worker that leaves the group; `fab stop` finds it by the release
marker). Each process appends one line `<pid> <role> <signal name>` to signals.log in
the cwd (the release directory) for every SIGTERM/SIGINT/SIGHUP it receives, then ends
`--linger` seconds after its first SIGTERM (long enough for a second one to arrive and
be counted). The main process serves /health and /v1/models on --port.

Signal-safe: the handlers do nothing; `signal.set_wakeup_fd` writes each signal's number
into a pipe (one byte per delivery) that the main thread reads. Standard library only.
"""
import http.server
import os
import select
import signal
import subprocess
import sys
import threading
import time

COUNTED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def count_signals(role, linger):
    """Append a line to signals.log per counted signal; return once `linger` s after a TERM."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    for s in COUNTED:
        signal.signal(s, lambda *_: None)
    ready = os.environ.pop("SIGNAL_SERVER_READY_FD", None)
    if ready:  # the parent waits for this before it reports ready
        os.write(int(ready), b"ok")
        os.close(int(ready))
    deadline = None
    while deadline is None or time.monotonic() < deadline:
        left = 3600 if deadline is None else deadline - time.monotonic()
        if not select.select([r], [], [], max(0.0, left))[0]:
            continue
        for num in os.read(r, 512):
            with open("signals.log", "a") as f:
                f.write("%d %s %s\n" % (os.getpid(), role, signal.Signals(num).name))
            if num == signal.SIGTERM and deadline is None:
                deadline = time.monotonic() + linger


def start_child(role):
    rfd, wfd = os.pipe()
    env = dict(os.environ, SIGNAL_SERVER_ROLE=role, SIGNAL_SERVER_READY_FD=str(wfd))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env,
                            pass_fds=(wfd,), stdin=subprocess.DEVNULL)
    os.close(wfd)
    if select.select([rfd], [], [], 30)[0]:
        os.read(rfd, 2)
    os.close(rfd)
    return proc


def serve(port):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"object":"list","data":[{"id":"signals","object":"model"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main():
    linger = float(sys.argv[sys.argv.index("--linger") + 1]) if "--linger" in sys.argv else 0.5
    role = os.environ.get("SIGNAL_SERVER_ROLE")
    if role == "setsid":
        os.setsid()
    if role:
        count_signals(role, linger)
        return
    children = [start_child("group"), start_child("setsid")]
    with open("children.txt", "w") as f:
        f.write(" ".join(str(c.pid) for c in children) + "\n")
    serve(int(sys.argv[sys.argv.index("--port") + 1]))
    print("signal server %d ready, children %s" % (os.getpid(), [c.pid for c in children]), flush=True)
    count_signals("server", linger)


if __name__ == "__main__":
    main()
