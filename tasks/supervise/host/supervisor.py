"""The supervisor: restarts a release's server on the host when [supervise] is on.

launch.py's reaper (the session leader that outlives the SSH session) runs `run()` from this
module: shipped into the release with the modules it uses as the package llmfab_host/, which
the reaper imports by path, in launch.py's isolated interpreter (`python -I -S`: nothing of
the server's or the host's PYTHONPATH, tasks/release/launcher.py). It starts the
server, and when the server ends (or hangs, see hangwatch.py) it records the attempt in
restarts.jsonl, stops what is left of it exactly as `fab stop` does (procs.py: TERM the
group once, grace, KILL, sweep by the LLMFAB_RELEASE marker; a SIGCONT first, so that a
stopped server takes the TERM), waits until GPU memory is
back to gpu-baseline.json (gpu.py's tolerance), waits the backoff and relaunches the same
argv and environment, appending to the same server.log after one marker line.
supervisor.json says where it stands (`fab status` shows it). `fab stop` sends SIGUSR1
first and waits until the state reads "off": from then on nothing is launched.

Signals are handled signal-safely: do-nothing handlers plus `signal.set_wakeup_fd`, so
every delivery is a byte on a pipe the loop selects on. Standard library only, Python >= 3.9.
"""
import json
import os
import select
import signal
import subprocess
import time

from ...base.host.safefile import append, open_append
from ...base.host.hosterrors import Damaged, exit_words, signal_name
from ...base.host.statefiles import read_json, utc_iso, write_json
from ...base.host import identity
from ...runtime.host import runtimes
from ...gpu.host.nvsmi import NVIDIA_SMI, baseline_limits, gpus_over, tolerance, unlisted_now
from .hangwatch import HangWatch, deploy_saw_ready, fatal_line, load_rules
from ...base.host.stopping import DEFAULT_GRACE_S, KILL_WAIT_S, stop_own_group

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)  # USR1: `fab stop`'s request; TERM: any stop
TICK_S = 5.0  # longest sleep between looks when nothing happens (idle CPU stays ~0)


def describe_end(rc):
    """(exit, signal name, text) of a Popen returncode (text: hosterrors.exit_words)."""
    if rc is not None and rc < 0:
        return None, signal_name(-rc), exit_words(rc)
    return rc, None, exit_words(rc)


def resume_group():
    """SIGCONT to this process's group before it is stopped: a server halted by SIGSTOP (or a
    debugger) takes the TERM that follows at once, not only the KILL after the whole grace."""
    try:
        os.killpg(os.getpgid(0), signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass


class Release:
    """The release directory this supervisor runs from (launch.py's directory)."""

    def __init__(self, here):
        self.here = here
        self.ddir = os.path.dirname(os.path.dirname(here))
        self.log_path = os.path.join(here, "server.log")

    def read_json(self, name):
        try:
            return read_json(os.path.join(self.here, name))
        except Damaged:  # supervision goes on without what a damaged file held
            return None

    def write_json(self, name, data):
        write_json(os.path.join(self.here, name), data)

    def append_jsonl(self, name, record):
        append(os.path.join(self.here, name), json.dumps(record) + "\n")

    def record_server(self, pid, started_at, port):
        """server.json as launch.py writes it; the pgid (this reaper) stays the same."""
        ident = self.read_json(identity.IDENTITY_FILE) or {}
        try:
            old = read_json(os.path.join(self.ddir, "server.json")) or {}
        except Damaged:  # rewritten below
            old = {}
        write_json(os.path.join(self.ddir, "server.json"),
                   {"pid": pid, "pgid": os.getpgid(0), "started_at": started_at,
                    "release": os.path.basename(self.here), "port": port, "name": old.get("name"),
                    "identity": ident.get("identity"), "cgroup": ident.get("cgroup")})

    def marked(self):
        """Live pids (but this one) of this release (identity.py: its cgroup or session)."""
        return list(runtimes.members(self.ddir, os.path.basename(self.here)))


class Supervisor:
    def __init__(self, here, argv, env, config, report_fd):
        self.rel = Release(here)
        self.rules = load_rules(os.path.join(here, "supervise_rules.json"))
        self.argv, self.env, self.cfg = argv, env, config
        self.report_fd = report_fd
        self.stopping = False
        self.restart_times = []          # time.time() of each restart, for the crash-loop window
        self.attempt = 0
        self.last = None
        self.status = {"pid": os.getpid(), "restart": config["restart"], "restarts": 0,
                       "state": "running", "last": None, "next_attempt_at": None, "reason": None}
        self._r, w = os.pipe()
        os.set_blocking(w, False)
        os.set_blocking(self._r, False)
        signal.set_wakeup_fd(w)
        for s in STOP_SIGNALS + (signal.SIGHUP, signal.SIGCHLD):
            signal.signal(s, lambda *_: None)

    # -- signals and waiting --------------------------------------------------------
    def _drain(self):
        try:
            data = os.read(self._r, 4096)
        except BlockingIOError:
            data = b""
        if any(n in STOP_SIGNALS for n in data) and not self.stopping:
            # The acknowledgement `fab stop` waits for: from here on nothing is launched.
            self.stopping = True
            self.publish(state="off", next_attempt_at=None)
        return self.stopping

    def sleep(self, seconds):
        """Wait up to `seconds`, waking on any signal; True if a stop was requested."""
        if not self._drain() and seconds > 0:
            select.select([self._r], [], [], seconds)
        return self._drain()

    def publish(self, **changes):
        self.status.update(changes, updated_at=time.time())
        self.rel.write_json("supervisor.json", self.status)

    # -- one attempt ------------------------------------------------------------------
    def launch(self, log):
        """Start the server unless a stop came first. No signal is blocked here (a child would
        inherit the mask): `fab stop` waits for the "off" that only this loop writes, after
        which it launches nothing, so whatever started before is in the stop's sweep."""
        if self._drain():
            return None
        self.attempt += 1
        self.offset = log.seek(0, os.SEEK_END)
        proc = subprocess.Popen(self.argv, cwd=self.rel.here, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, close_fds=True)
        self.started_at = utc_iso()
        self.launched = time.time()
        self.rel.record_server(proc.pid, self.started_at, self.cfg["port"])
        self.publish(state="running", next_attempt_at=None, attempt=self.attempt)
        return proc

    def watch(self, proc):
        """Until the server exits, hangs or a stop comes: -> (returncode, hang text or None).
        supervisor.json's `health` says since when /health has (not) answered 200, written
        when that changes: proof, on the host, that the hang watch is looking."""
        hang = HangWatch(self.cfg) if self.cfg.get("hang_timeout") else None
        while True:
            rc = proc.poll()
            if rc is not None:
                return rc, None
            if self.stopping:
                return None, None
            wait = TICK_S if hang is None else hang.next_probe_in()
            if self.sleep(wait) or hang is None:
                continue
            if not hang.ready:
                hang.armed_by(deploy_saw_ready(self.rel.here, self.launched - 1))
            why = hang.probe()
            if hang.ready and hang.answering != (self.status.get("health") or {}).get("answering"):
                self.publish(health={"answering": hang.answering, "since": time.time()})
            if why and proc.poll() is None:
                return None, why

    def end_attempt(self, rc, hang, ended_at):
        exit_, sig, text = describe_end(rc)
        line, rule = (hang, "hung") if hang else fatal_line(self.rel.log_path, self.offset, self.rules)
        record = {"attempt": self.attempt, "started_at": self.started_at, "ended_at": ended_at,
                  "exit": exit_, "signal": sig, "rule": rule, "line": line}
        self.rel.append_jsonl("restarts.jsonl", record)
        self.last = {k: record[k] for k in ("exit", "signal", "rule", "line", "ended_at")}
        self.last_text = text + (", hung" if hang else "")
        failed = bool(hang) or rc != 0 or rule is not None
        self.publish(last=self.last)
        return failed

    # -- between attempts -----------------------------------------------------------
    def give_up(self, reason):
        self.publish(state="gave-up", reason=reason, next_attempt_at=None)

    def wait_for_gpu(self):
        """True once the GPUs hold nothing of this release's last attempt; False on stop or timeout.
        Per GPU, the memory no listed process accounts for (a dead process the driver still
        frees) back to what it was at launch: another deployment's memory on the GPU is listed,
        so it changes nothing. A baseline from before that record: the whole device's reading."""
        baseline = self.rel.read_json("gpu-baseline.json") or {}
        limits, smi = baseline_limits(baseline), baseline.get("nvidia_smi") or NVIDIA_SMI
        if not limits:
            return True
        self.publish(state="waiting-for-gpu")
        deadline = time.monotonic() + self.cfg["memory_timeout"]
        base = baseline.get("unlisted")
        if base is not None:
            limits = {int(i): m + tolerance(m) for i, m in base.items() if int(i) in limits}
        while True:
            over = unlisted_now(smi, limits) if base is not None else gpus_over(smi, limits)
            if over is not None and not over:
                return True
            if time.monotonic() >= deadline:
                what = "; ".join("GPU %d uses %s MiB (limit %d MiB)" % (g, m, limits[g]) for g, m in over or ())
                self.give_up("GPU memory not back to the baseline after %.0f s: %s" % (
                    self.cfg["memory_timeout"], what or "nvidia-smi gave no reading"))
                return False
            if self.sleep(0.25):
                return False

    def backoff(self):
        """The wait before the next restart, or None when the crash loop limit is reached."""
        t = time.time()
        self.restart_times = [x for x in self.restart_times if t - x < self.cfg["window"]]
        if len(self.restart_times) >= self.cfg["max_restarts"]:
            return None
        return min(self.cfg["backoff"] * 2 ** len(self.restart_times), self.cfg["backoff_max"])

    def run(self):
        with os.fdopen(open_append(self.rel.log_path), "ab") as log:
            try:
                proc = self.launch(log)
            except OSError as e:  # launch.py reports it and exits 1, as without supervision
                os.write(self.report_fd, json.dumps({"error": "cannot start %s: %s" % (self.argv[0], e.strerror),
                                                     "errno": e.errno, "argv0": self.argv[0]}).encode())
                return 1
            if proc is None:
                return self.finish(None)
            os.write(self.report_fd, json.dumps({"pid": proc.pid}).encode())
            os.close(self.report_fd)
            while True:
                rc, hang = self.watch(proc)
                if self.stopping:  # `fab stop` ends the server; just record how it ended
                    self.publish(state="off", next_attempt_at=None)
                    return self.finish(proc.wait())
                ended_at = utc_iso()
                if hang:  # when it was seen, to the microsecond (the record has seconds)
                    self.publish(hang_detected_at=time.time())
                # What is left goes first (a hung server included: it exits by our TERM or
                # KILL, and that is how its attempt ended); then the record. Meanwhile nothing
                # runs: the attempt's leftovers (an EngineCore outliving its API server holds
                # the GPU) are being ended, so the state is no longer "running".
                self.publish(state="waiting-for-gpu", health=None)
                resume_group()
                stop_own_group(self.rel.marked, self.cfg.get("grace", DEFAULT_GRACE_S), self.sleep)
                try:
                    proc.wait(KILL_WAIT_S)
                except subprocess.TimeoutExpired:  # stuck in the kernel; its returncode stays None
                    pass
                rc = proc.returncode
                failed = self.end_attempt(rc, hang, ended_at)
                if self.stopping:
                    return self.finish(rc)
                if not failed and self.cfg["restart"] != "always":
                    self.publish(state="off")
                    return self.finish(rc)
                delay = self.backoff()
                if delay is None:
                    self.give_up("crash loop: %d restarts within %.0f s (max_restarts = %d); last "
                                 "attempt: %s" % (len(self.restart_times), self.cfg["window"],
                                                  self.cfg["max_restarts"], self.last_text))
                    return self.finish(rc)
                if not self.wait_for_gpu():
                    return self.finish(rc)
                self.publish(state="backoff", next_attempt_at=time.time() + delay)
                if self.sleep(delay):
                    self.publish(state="off", next_attempt_at=None)
                    return self.finish(rc)
                self.restart_times.append(time.time())
                log.write(("--- llmfab: restart %d of the server (previous attempt: %s%s) at %s ---\n"
                           % (self.attempt, describe_end(rc)[2],
                              ", " + self.last["rule"] if self.last["rule"] else "", utc_iso())).encode())
                log.flush()
                try:
                    proc = self.launch(log)
                except OSError as e:
                    self.give_up("cannot start %r: %s" % (self.argv[0], e))
                    return self.finish(rc)
                if proc is None:
                    return self.finish(rc)
                self.publish(restarts=self.status["restarts"] + 1)

    def finish(self, rc):
        """The supervisor is done: exit.json says how the last attempt ended."""
        if self.stopping and self.status["state"] != "gave-up":
            self.publish(state="off", next_attempt_at=None)
        self.rel.write_json("exit.json", {"returncode": rc, "ended_at": utc_iso(),
                                          "supervisor": self.status["state"]})
        return 0


def run(here, argv, env, config, report_fd):
    """Called in launch.py's reaper, after setsid. Returns when supervision ends (the exit
    status for the reaper). A bug here must not pass silently: its traceback goes to
    server.log and supervisor.json reads gave-up."""
    sup = Supervisor(here, argv, env, config, report_fd)
    try:
        return sup.run()
    except Exception:
        import traceback
        try:
            append(sup.rel.log_path, "--- llmfab: the supervisor failed ---\n" + traceback.format_exc())
        except OSError:
            pass
        sup.give_up("the supervisor failed (traceback in server.log)")
        return 1
