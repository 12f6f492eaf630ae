"""The supervisor's eyes: hang detection over HTTP, and the fatal line (and rule) of an attempt's log.

Shipped into a supervised release with the supervisor (tasks/release/launcher.py). Hung (docs/supervision.md), once the
server answered /health 200: no 200 for `hang_timeout` s since the last one (a probe
fails after min(5, hang_timeout) s), or requests running/waiting while the generated-token
counter in /metrics stays put for `hang_timeout` s. Busy and progressing, or idle with
nothing waiting, is not hung. The fatal line is chosen from the failure-rule table by the
client's own scanner (tasks/failures/host/logscan.py), reading the attempt's part of the log
once (tasks/base/host/startlog.py). Standard library only, Python >= 3.9.
"""
import http.client
import json
import os
import time

from ...base.host.startlog import StartLog
from ...failures.host import records
from ...failures.host.logscan import LogScanner
from ...base.host.hosterrors import Damaged
from ...base.host.statefiles import read_json

# The failure-rule table (tasks/failures/rules/) comes as data: supervise_rules.json beside
# this file, [{id, priority, wrapper, patterns: [{regex, after}]}] (tasks/release/launcher.py).
READ_MAX = 4 << 20  # bytes of an attempt's log read for its fatal line (the tail if longer)

# The Prometheus names of vLLM's and SGLang's counters llmfab reads, here and in
# tasks/measure/metrics.py (which imports them from here).
GENERATED = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "sglang:num_requests_running")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "sglang:num_requests_waiting")
BUSY = RUNNING + WAITING


def load_rules(path):
    """The failure rules (tasks/failures/host/records.py Rule) from supervise_rules.json; [] if
    it cannot be read."""
    try:
        with open(path) as f:
            return records.from_data(json.load(f))
    except (OSError, ValueError):
        return []


def fatal_line(log_path, offset, rules=()):
    """(line, rule id) of what explains this attempt's end, from the log written since
    `offset` (its last READ_MAX bytes): the line the client's explainer would name, by the same
    scanner (tasks/failures/host/logscan.py); with no known line, (the last exception of a
    traceback, "Type: message", None), else (None, None)."""
    try:
        size = os.path.getsize(log_path)
    except OSError:
        return None, None
    scanner = LogScanner(rules)
    StartLog(log_path, max(offset, size - READ_MAX), {"fatal": scanner}).read(READ_MAX, final=True)
    fatal = scanner.feed("", final=True)
    if fatal is not None:
        return fatal.line.strip()[:500], fatal.rule.id
    last = scanner.last_exception()
    return (last[:500] if last else None), None


def metric_values(text):
    """{name: summed value} for the names hang detection reads, from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in GENERATED or name in BUSY:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


def deploy_saw_ready(release_dir, since):
    """When deploy (or rollback) saw this start ready: the release's startup.json `ready_at`
    (epoch s, written by the agent before the task returns) if it is not before `since` (the
    start's own beginning); None before that, for an earlier start, or where it is damaged.
    What arms a watch whose own probe never got a 200 (HangWatch.armed_by)."""
    try:
        ready_at = (read_json(os.path.join(release_dir, "startup.json")) or {}).get("ready_at")
    except Damaged:
        return None
    return ready_at if isinstance(ready_at, (int, float)) and ready_at >= since else None


class HangWatch:
    def __init__(self, cfg):
        self.timeout = float(cfg["hang_timeout"])
        self.probe_timeout = min(5.0, self.timeout)
        self.interval = self.probe_timeout / 2  # detection within hang_timeout + one probe
        self.host, self.port = cfg["probe_host"], cfg["port"]
        self.health_path, self.metrics_path = cfg["health_path"], cfg.get("metrics_path")
        self.ready = False
        self.answering = None  # whether the last /health probe got a 200 (None: none yet)
        self.last_ok = self.last_progress = None
        self.last_generated = None
        self.next_at = time.monotonic() + self.interval

    def next_probe_in(self):
        return max(0.0, self.next_at - time.monotonic())

    def armed_by(self, ready_at):
        """Ready as someone else saw it (deploy's startup.json, epoch seconds): the watch is armed
        from then on, though its own probe never got a 200 (a server stopped right after deploy
        said ready was otherwise "never ready" for ever, issue 36)."""
        if not self.ready and ready_at is not None:
            self.ready = True
            self.last_ok = time.monotonic() - max(0.0, time.time() - ready_at)

    def _get(self, path):
        """(status, body) or (None, None) if nothing answered within the probe timeout."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.probe_timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read(1 << 20)
        except (OSError, http.client.HTTPException):
            return None, None
        finally:
            conn.close()

    def probe(self):
        """One look; returns why the server is hung, or None."""
        code, _ = self._get(self.health_path)
        now = time.monotonic()
        self.answering = code == 200
        if code == 200:
            self.ready = True
        # Until ready, look as often as deploy's wait does: the window in which a server can
        # answer once and stop before the watch has seen it stays short.
        self.next_at = now + (self.interval if self.ready else min(0.5, self.interval))
        if code == 200:
            self.ready = True
            self.last_ok = now
        if not self.ready:
            return None  # never ready: start-up is deploy's business, not a hang
        if now - self.last_ok >= self.timeout:
            return "llmfab: hung: no /health 200 for %.1f s (hang_timeout = %g s)" % (
                now - self.last_ok, self.timeout)
        return self._progress(now) if code == 200 and self.metrics_path else None

    def _progress(self, now):
        code, body = self._get(self.metrics_path)
        if code != 200:
            return None
        values = metric_values(body.decode("utf-8", "replace"))
        generated = sum(values.get(n, 0.0) for n in GENERATED)
        busy = sum(values.get(n, 0.0) for n in BUSY) > 0
        if not busy or self.last_generated is None or generated != self.last_generated:
            self.last_progress = now
        self.last_generated = generated
        if busy and now - self.last_progress >= self.timeout:
            return ("llmfab: hung: requests waiting and no token generated for %.1f s "
                    "(hang_timeout = %g s)" % (now - self.last_progress, self.timeout))
        return None
