"""Event-driven wait tick: watch a launched server on the host and answer when something changes.

One `watch` request holds for at most `wait_s` (the client's poll interval) while this
agent checks, every TICK_S on the host, what decides a deploy:

- the process exiting (its last log lines are read after it is gone);
- the log growing with a line that matches one of the client's `hints` (the fatal-line
  patterns of tasks/failures/logscan.py, sent with the request so their table stays the client's);
  the verdict itself stays the client's scanner's, this only answers early;
- the port starting to accept connections, then /health and /v1/models answering
  differently from the state the client last saw (`seen`);
- with `port_check` (command servers, whose argv llmfab does not write the port into), the
  server's process tree answering /health with 200 on another port while the expected one is
  closed: a server bound to the wrong port (why `wrong_port`, the port in `serving_on`), which
  would otherwise be waited for until the timeout. Checked at most every PORT_CHECK_S.

The log is read through the agent's one reader of this start (tasks/base/host/startlog.py),
which feeds the start-up phases' Parser (answered as `startup`: the live phase and the phases
ended so far) and, for vLLM, the speculative-decoding evidence, so that the ops at ready
answer from what was read here. Each answer carries the new lines once, for the client's
scanner.

It answers at once on such a change (or on the first request, `seen` None), else after
`wait_s` with the progress so far. Cheap while a model loads: a tick is a /proc read,
a stat of the log and one refused TCP connect; HTTP is spoken only once the port
accepts, and nvidia-smi (tens of ms of CPU per run) at most every `gpu_every_s`.
"""
import os
import re
import socket
import time

from ...base.host import startlog
from ...doctor.host import spec_evidence
from ...gpu.host import nvsmi
from ...startup.host import phases
from ...base.host.hostenv import CONTEXT
from ...base.host.layout import read_exit, read_stop
from ...base.host.procfs import pid_alive
from ...base.host.statefiles import expand
from .probe import http_get, probe_host, served_models, serving_elsewhere, tree_listeners

TICK_S = 0.05          # how often the host looks: events are seen within ~25 ms on average
HTTP_EVERY_S = 0.1     # once the port accepts: /health (and /v1/models) at most this often
SETTLE_S = 0.05        # after a hinted line: the lines that follow it (the explanation) too
MAX_WAIT_S = 60.0      # one request never holds longer, whatever the client asks
PORT_CHECK_S = 1.0     # while the port is closed (`port_check`): does the tree serve another?


def address(host, port):
    """(family, sockaddr) of host:port, resolved once per request (never a lookup per tick)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        return family, sockaddr
    except (OSError, IndexError):
        return None


def accepts(addr, timeout=0.5):
    """True when a TCP connect to addr succeeds (a refused one costs ~30 us)."""
    if addr is None:
        return True  # unresolvable here: let the HTTP probe say why
    s = socket.socket(addr[0], socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(addr[1])
        return True
    except OSError:
        return False
    finally:
        s.close()


def _hints(hints):
    """Compiled hint patterns, or None: then any new line answers (no hints sent, or one
    that this Python cannot compile, e.g. syntax newer than the host's 3.9)."""
    if hints is None:
        return None
    key = tuple(tuple(h) for h in hints)
    cache = CONTEXT.setdefault("watch_hints", {})
    if key not in cache:
        try:
            cache[key] = [re.compile(p, f) for p, f in key]
        except (re.error, TypeError, ValueError):
            cache[key] = None
    return cache[key]


def hinted(hints, lines):
    """Whether new log lines hold one worth answering for (searched line by line, as
    the client's scanner does, so `^` anchors mean the start of a line)."""
    if not lines:
        return False
    if hints is None:
        return True
    return any(h.search(line) for line in lines for h in hints)


def _gpus(smi, devices, gpu_every_s):
    """The deployment's GPUs: read at most every gpu_every_s, else the last reading."""
    if not smi:
        return None
    last = CONTEXT.get("watch_gpus")
    now = time.monotonic()
    if last is None or last[0] != smi or now - last[1] >= float(gpu_every_s or 0):
        last = (smi, now, nvsmi.select(nvsmi.read_gpus(smi), devices))
        CONTEXT["watch_gpus"] = last
    return last[2]


class _Hints:
    """The watch request's consumer of the log's lines: whether one matched a hint."""

    def __init__(self, hints):
        self.hints, self.seen = hints, False

    def feed_lines(self, lines, final=False):
        self.seen = self.seen or hinted(self.hints, lines)


def start_log(rdir, pid, log_offset, start_offset, engine, engine_version):
    """The agent's StartLog of this start (from `start_offset`) at the request's `log_offset`,
    feeding the start-up phases' Parser and, for vLLM, the speculative-decoding evidence: what
    the ops at ready (`startup`, `spec_evidence`) answer from without reading the log again."""
    path = os.path.join(rdir, "server.log")
    offset = int(log_offset or 0)
    start = int(offset if start_offset is None else start_offset or 0)
    log = startlog.of(path, start)
    if log.offset != offset:  # not where the client is (a watch answer it never got): anew
        startlog.forget(path, start)
        log = startlog.of(path, start)
    version = phases.version_of(rdir, engine_version)
    if engine and engine != "command":
        phases.parser_of(log, engine, version, lambda: phases.process_started(pid) or time.time())
        if engine == "vllm":
            log.consumer("spec_evidence", spec_evidence.Head)
    log.read_to(offset)
    return log


def op_watch(deploy_dir, release, pid, port, host="127.0.0.1", log_offset=0, wait_s=0, seen=None,
             hints=None, health_path="/health", models_path=None, api_key=None, port_check=False,
             nvidia_smi=None, devices=None, gpu_every_s=0, engine=None, engine_version=None,
             start_offset=None):
    t0 = time.monotonic()
    deadline = t0 + min(max(float(wait_s or 0), 0.0), MAX_WAIT_S)
    rdir = os.path.join(expand(deploy_dir), "releases", release)
    host = probe_host(host)
    addr = address(host, port)
    hints = _hints(hints)
    out = {"gpus": _gpus(nvidia_smi, devices, gpu_every_s)} if nvidia_smi else {}
    log = start_log(rdir, pid, log_offset, start_offset, engine, engine_version)
    tick = log.consumers["watch"] = _Hints(hints)
    parts, chars = [], 0
    health = models = None
    next_http, next_port_check, settle_until, why = 0.0, 0.0, None, None
    while why is None:
        now = time.monotonic()
        alive = pid_alive(pid)
        text = log.read()
        if not alive:
            text += log.read(final=True)  # the agent saw the process gone: its last words are in
        parts.append(text)
        chars += len(text)
        if not alive:
            why = "exited"
            break
        if settle_until is None and tick.seen:
            settle_until = now + SETTLE_S
        elif settle_until is not None and now >= settle_until and (not text or now >= settle_until + 0.2):
            why = "hint"
        if chars >= startlog.CHUNK:
            why = "log"
        if now >= next_http:
            health = models = None
            if accepts(addr):
                status, body = http_get(port, health_path, host)
                health = status if status is not None else body.decode("utf-8", "replace")
                if status == 200 and models_path:
                    models = served_models(port, models_path, host, api_key)
                next_http = time.monotonic() + HTTP_EVERY_S
            elif port_check and now >= next_port_check:
                other = serving_elsewhere(pid, port, host, health_path)
                next_port_check = time.monotonic() + PORT_CHECK_S
                if other is not None:
                    out["serving_on"], why = other, "wrong_port"
        state = {"alive": alive, "health": health if isinstance(health, int) else None,
                 "models": models}
        if why is None and (seen is None or state != seen):
            why = "first" if seen is None else "changed"
        if why is None and now >= deadline and settle_until is None:
            why = "timeout"
        if why is None:
            time.sleep(TICK_S)
    state = {"alive": alive, "health": health if isinstance(health, int) else None, "models": models}
    if alive and health == 200:  # where it really listens, once it answers (deploy's exposure warning)
        out["listening"] = tree_listeners(pid, port)
    del log.consumers["watch"]
    parser = next((c for c in log.consumers.values() if isinstance(c, phases.Parser)), None)
    if parser is not None:  # the live phase, and the phases ended so far (tasks/startup/estimate.py)
        out["startup"] = {"phase": parser.current, "ended": parser.ended()}
    out.update(alive=alive, exit=read_exit(rdir, pid),
               log={"offset": log.offset, "text": "".join(parts), "size": log.size},
               stopped=None if alive else read_stop(rdir, pid),  # by another task: not a failure
               health=health if alive else None, models=models if alive else None,
               state=state, why=why, held_s=round(time.monotonic() - t0, 3),
               at=time.time())  # the host's clock when it answered: a start's ready time
    return out

