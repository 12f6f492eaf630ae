"""`fab status`: gather one record per host, then render it.

    fab status [--json]

`gather(host, profile)` asks the host (state, GPUs, one poll, /metrics) and returns a
`Status`: the JSON record of `fab status --json` (docs/reference/cli.md) (`host, running, pid, release, port, health,
asleep` (vLLM sleep mode, from /is_sleeping; null where the server has none), `served_name, gpus, spec, generation_tokens_per_s`, plus `uptime_s, exit, fatal`,
`cluster`, and the release's start: `startup` [{phase, at, seconds}], `compile_cache`,
`ready_s`, as its deploy recorded them; `exposure`: the WARN checks `{status, check, message,
address, port}` of a running server whose own listening socket on its port is bound to every
address (0.0.0.0, ::) where no API key covers it, whatever the profile says; from /metrics also `requests_running,
requests_waiting, kv_cache_usage` (0..1), null where the engine does not say), `gpu_holders`
[{pid, name, gpu, mib, ours, deployment, release}]: every process with memory on the profile's
GPUs, `ours` when it is one of this deployment's (base/host/identity.py; with no server
running such a one is named in the text with the `fab kill-gpu-procs` that frees it), else
the other llmfab deployment it belongs to or none, one line each; `identity` (what makes a
process this deployment's: "cgroup", "session", or "marker" for an older release), and the lines
only a human reads. `render(status)` turns it into text and
`verdict(status)` into the host's result: no host is needed to test either.
Exit: 0 running and healthy; 1 not running or unhealthy; 3 unreachable.
"""
import datetime
import json
from dataclasses import dataclass, field

from .errors import ExitCode
from .base.host.hosterrors import exit_words
from .fleet.fanout import HostResult
from .output import Block, fab_hint, indented
from .gpu.memory import other_holder_lines
from . import runtime as runtime_status


@dataclass
class Status:
    record: dict
    metric_lines: list = field(default_factory=list)   # speculative acceptance, tokens/s, load
    cluster_lines: list = field(default_factory=list)
    cluster_ok: bool = True
    why: str = None                                    # why a dead server ended (the cause)
    fix: str = None                                    # and what to do (tasks/failures/failed_server.py)
    source: str = None                                 # the failure rule that said so
    supervisor_lines: list = field(default_factory=list)
    holder_lines: list = field(default_factory=list)   # our processes holding GPU memory, no server
    exposure: list = field(default_factory=list)       # WARN checks: where it listens on every address

    @property
    def healthy(self):
        r = self.record
        return bool(r["running"]) and r["health"] == 200 and self.cluster_ok


def uptime(server, state):
    """Seconds since server.json's started_at, by the host's clock (None if unknown)."""
    try:
        started = datetime.datetime.fromisoformat(server["started_at"]).timestamp()
        return max(0, round(state["now"] - started))
    except (KeyError, TypeError, ValueError):
        return None


def duration(seconds):
    if seconds is None:
        return "?"
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s")


def gather(host, profile, ddir):
    """Everything `fab status` reports about one host, as a Status."""
    host.start()
    st = host.call("state", deploy_dir=ddir)
    server = st.get("server") or {}
    alive = bool(st["alive"])
    record = {"host": host.name, "running": alive, "pid": server.get("pid"),
              "release": server.get("release"), "port": server.get("port"),
              "health": None, "asleep": None, "served_name": None, "gpus": None, "spec": None, "sampling": None,
              "generation_tokens_per_s": None,
              "requests_running": None, "requests_waiting": None, "kv_cache_usage": None,
              "uptime_s": uptime(server, st) if alive else None, "exit": None, "fatal": None,
              "state": "running" if alive else "not-deployed", "last_failed": st.get("failed"),
              "deployed": bool(server), "exposure": []}
    record.update(runtime_status.status_fields(st))  # runtime, unit / container (tasks/runtime/)
    started = st.get("startup") or {}  # the release's start, as deploy recorded it
    record.update(startup=started.get("phases"), compile_cache=started.get("compile_cache"),
                  ready_s=started.get("ready_s"))
    out = Status(record)
    # the GPUs' memory, and who holds it (ours: one of this deployment's processes,
    # base/host/identity.py; else another deployment's or nobody's), in one round trip
    smi = dict(nvidia_smi=profile.gpu.nvidia_smi, devices=profile.devices)
    answers = host.batch({"gpus": ("gpus", smi), "holders": ("gpu_holders", dict(smi, deploy_dir=ddir))})
    gpus, holders = answers["gpus"], answers["holders"]
    record["gpus"] = [{"index": g["index"], "used_mib": g["used_mib"], "total_mib": g["total_mib"]}
                      for g in (gpus["gpus"] or [])] or None
    held = holders["holders"]
    record["gpu_holders"] = [{k: h.get(k) for k in ("pid", "name", "gpu", "mib", "ours", "deployment", "release")}
                             for h in held]
    record["identity"] = (server.get("identity") or "marker") if server else None
    if not alive:  # an engine child that outlived its server keeps the GPU from the next start
        out.holder_lines = [f"GPU {h['gpu']}: pid {h['pid']} ({h['name']}) of release {h['release']} holds "
                            f"{h['mib']} MiB with no server running; `{fab_hint(profile, 'kill-gpu-procs')}` "
                            "frees it" for h in held if h["ours"]]
    # always: who else holds memory on this deployment's GPUs (another deployment, or not ours)
    out.holder_lines += other_holder_lines(held)
    if alive:
        poll = host.call("poll", deploy_dir=ddir, release=server["release"], pid=server["pid"],
                         port=server["port"], host=profile.server.host,
                         health_path=profile.ready.health_path,
                         models_path=profile.ready.models_path, api_key=profile.api_key,
                         log_offset=1 << 62, listeners=True)
        record["health"] = poll["health"]
        from .steps.preflight import seen_exposure  # from its sockets, whatever the profile says
        out.exposure = record["exposure"] = seen_exposure(profile, poll.get("listening"))
        models = poll.get("models") or []
        record["served_name"] = models[0] if len(models) == 1 else (models or None)
    record["asleep"] = asleep(host, profile, server) if alive and record["health"] == 200 else None
    if alive and record["health"] == 200:
        from .measure.metrics import status_metrics
        m = status_metrics(host, profile, server)
        record["spec"], record["generation_tokens_per_s"] = m["spec"], m["generation_tokens_per_s"]
        record.update(m.get("load") or {})
        out.metric_lines = m["lines"]
        if record["spec"] is not None:  # the doctor's verdict and likely causes (tasks/doctor/findings.py)
            from .doctor.findings import status_verdict, with_verdict
            text, more, record["sampling"] = status_verdict(host, profile, ddir, server["release"],
                                                            m, record["spec"])
            if text:
                out.metric_lines = with_verdict(out.metric_lines, text) + more
        if record["asleep"]:
            out.metric_lines = [SLEEP_LINE] + out.metric_lines
    if profile.cluster is not None:  # the Ray cluster under the server (tasks/fleet/ray_cluster.py)
        from .fleet.ray_cluster import cluster_status
        record["cluster"], out.cluster_lines, out.cluster_ok = cluster_status(host, profile, ddir)
    from .supervise import status_view
    record["supervisor"] = status_view.record(st.get("supervisor"))
    out.supervisor_lines = status_view.lines(record["supervisor"], (st.get("supervisor") or {}).get("reason"))
    failed = st.get("failed")
    if failed and not alive and (not server or failed["release"] >= server.get("release", "")):
        # the last deploy did not start (its release says why: release/host/launch.py, steps/wait.py)
        record.update(state="failed", release=failed["release"], deployed=True,
                      fatal={k: failed.get(k) for k in ("rule", "line", "cause", "fix")})
        if server.get("release") == failed["release"]:
            record["exit"] = st.get("exit") or None
        else:  # it never ran: server.json still names the release before it
            record.update(pid=None, startup=None, compile_cache=None, ready_s=None)
        out.why, out.fix = failed.get("cause"), failed.get("fix")
        out.source = f"failure rule {failed.get('rule')}, recorded in release {failed['release']}"
    elif server and not alive:
        record["exit"] = st.get("exit") or None
        record["state"] = "stopped" if (record["exit"] or {}).get("stopped") else "exited"
        from .failures.failed_server import explain_dead
        ex = explain_dead(host, profile, ddir, server, record["exit"])
        if ex:  # why it died: an engine crash can exit 0, so the log says more than the code
            record["fatal"] = ex.as_json()
            record["state"] = "failed"
            out.why, out.fix, out.source = ex.cause, ex.fix, ex.source_text()
        if record["supervisor"]["state"] == "gave-up":  # the crash loop first, then its line
            out.why = status_view.gave_up_why(record["supervisor"], st["supervisor"].get("reason"))
    return out


# vLLM's sleep mode (issue 39, docs/endpoint.md): asleep, /health still answers 200 and a
# completion waits unanswered until /wake_up; status says so instead of looking healthy.
SLEEP_LINE = ("asleep (vLLM sleep mode): /health answers 200 but no completion is answered until it "
              "is woken (`fab wake` of its endpoint, a request through the endpoint, or POST /wake_up)")


def asleep(host, profile, server):
    """True / False from the server's GET /is_sleeping (vLLM with --enable-sleep-mode; the route
    needs VLLM_SERVER_DEV_MODE=1), None where it has no sleep mode or does not say."""
    if profile.server.engine != "vllm" or not profile.server.flags.has("enable-sleep-mode"):
        return None
    r = host.call("endpoint_http", host_addr=profile.server.host, port=server["port"],
                  path="/is_sleeping", method="GET", timeout=10)
    if r.get("status") != 200:
        return None
    try:
        return bool(json.loads(r["text"]).get("is_sleeping"))
    except (ValueError, AttributeError):
        return None


def health_words(health):
    """`health 200`, `health 503`; the probe's error in words when nothing answered."""
    if isinstance(health, int):
        return f"health {health}"
    return f"health: no answer ({health})" if health else "health: not probed"


def model_words(served):
    """`, model NAME` (several: `, models A, B`), or nothing when /v1/models listed none."""
    if isinstance(served, list):
        return ", models " + ", ".join(str(m) for m in served) if served else ""
    return f", model {served}" if served else ""


def render(status):
    """The human lines of one host's status."""
    r = status.record
    failed = r.get("last_failed")
    if r["running"]:
        lines = [f"running: release {r['release']}, pid {r['pid']}, up {duration(r['uptime_s'])}, "
                 f"port {r['port']}, {health_words(r['health'])}{model_words(r['served_name'])}"]
        if failed and failed["release"] > (r["release"] or ""):  # put back after a failed deploy
            lines.append(Block(f"last deploy failed: release {failed['release']}: {failed.get('cause')}; "
                               f"release {r['release']} runs instead", (("fix", failed.get("fix")),), indent=2))
    elif r.get("state") == "failed" and failed and r["release"] == failed["release"]:
        lines = [Block(f"last deploy failed: {status.why}",
                       (("release", failed["release"]), ("fix", status.fix), ("source", status.source)))]
    elif r["deployed"]:
        ex = r["exit"] or {}
        how = f"{exit_words(ex['returncode'])} at {ex['ended_at']}" if ex else "not running"
        if ex.get("stopped"):  # on purpose (tasks/base/host/layout.py STOP_FILE): not a failure
            how = f"was stopped by {ex['stopped'].get('by')} at {ex['ended_at']} ({exit_words(ex['returncode'])})"
        between = (r.get("supervisor") or {}).get("state")
        if between in ("backoff", "waiting-for-gpu"):
            how = f"is down; the supervisor restarts it ({between})"
        elif runtime_status.restarting(r):
            how = f"is down; systemd restarts it ({r['unit']['SubState']})"
        # why it ended, and the fix, wrapped under the headline (tasks/output.py Block)
        lines = [Block(f"not running: release {r['release']} {how}",
                       (("why", status.why), ("fix", status.fix), ("source", status.source)))]
    else:
        lines = ["not deployed"]
    from .startup.estimate import summary
    if r["running"] and summary(r):
        lines.append("  " + summary(r) + f" (ready in {r['ready_s']:.1f} s)")
    from .steps.preflight import check_block
    lines += [indented(check_block(c), 2) for c in status.exposure]
    lines += [f"  GPU {g['index']}: {g['used_mib']} / {g['total_mib']} MiB" for g in r["gpus"] or []]
    lines += [indented(t, 2) for t in status.holder_lines]
    lines += [indented(t, 2) for t in status.metric_lines]
    lines += [indented(t, 2) for t in status.supervisor_lines]
    lines += [indented(t, 2) for t in runtime_status.status_lines(r)]
    return lines + list(status.cluster_lines)


def json_record(status):
    """The --json object: `host`, then `ok` (exit 0: running and healthy), then the record."""
    out = {"host": status.record["host"], "ok": status.healthy}
    out.update((k, v) for k, v in status.record.items() if k != "deployed")
    return out



def verdict(status):
    healthy = status.healthy
    return HostResult(status.record["host"], 0 if healthy else ExitCode.FAILED,
                      "healthy" if healthy else "unhealthy" if status.record["running"]
                      else "not deployed" if status.record.get("deployed") is False else "not running")


def status(c, opts):
    """Body of `fab status` (opts: tasks.options.StatusOptions)."""
    from .steps.preflight import deploy_dir
    from .fleet.runner import load, run_task
    profile = load(c, opts.profile)
    ddir = deploy_dir(profile)

    def op(host, reporter):
        st = gather(host, profile, ddir)
        lines = render(st)
        head = 1  # the headline (with why and fix) before --json's object, the rest after
        reporter.lines(host.name, lines[:head])
        if opts.json:
            reporter.emit_json(json_record(st))
        reporter.lines(host.name, lines[head:])
        return verdict(st)
    run_task(c, profile, op, opts, title="status", json_mode=opts.json)
