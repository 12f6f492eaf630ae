"""`fab releases` and `fab rollback`: the releases kept on each host, and going back one.

    fab releases [--json] [--keep N]
    fab rollback [--timeout S] [--no-wait]

`releases` lists, oldest first, each release's stamp, the first 12 hex digits of the
sha256 of its saved profile.toml, when it started (server.json for the running
one, else the stamp), its time to ready and compile cache (warm/cold) when a deploy
waited for it (startup.json; --json: `ready_s`, `startup` phases, `compile_cache`), how
it ended (from the exit.json the launcher's reaper writes) and its log size; `*` marks `current`. `--keep N` first prunes to the newest
N releases under the deploy lock (never the current one or the one before it);
deploy prunes to `target.keep_releases` (default 5) after each launch.

`rollback`, under the lock: stops the running server (as `fab stop` does) and runs
the release before `current` again from its own files (its launch.py: same argv,
same environment, same secrets.json), points `current` at it and waits until it is
ready like deploy. Nothing is re-rendered from the profile given on the command
line; readiness (port, health and models paths, served name, timeout) comes from
the old release's saved profile.toml, falling back to the given profile's settings.
Releases that never started (no server.log), or whose server failed to start (a failed
deploy leaves start-failed.json in its release), are skipped.
"""

import datetime
import os
from dataclasses import replace
import tempfile

from .errors import OperationFailed
from .base.host.hosterrors import exit_words
from . import output
from .fleet.fanout import HostResult
from .runtime import host_python


def describe_end(rec):
    """How a release's last run ended, in words: running, exited N, killed by SIGX, ..."""
    if rec.get("running"):
        return f"running (pid {rec['pid']})" if rec.get("pid") else "running"
    failed = rec.get("start_failed")
    if failed:
        return f"failed to start ({failed['rule']})" if failed.get("rule") else "failed to start"
    ex = rec.get("exit")
    if ex and ex.get("returncode") is not None:
        how = exit_words(int(ex["returncode"]))
        if ex.get("stopped"):  # on purpose: however it exited, it did not fail
            return f"stopped by {ex['stopped'].get('by') or 'a stop'}: {how}"
        return how
    if rec.get("log_bytes") is None:
        return "never started"
    return "gone (no exit record)"


def stamp_time(stamp):
    """`20250101T120000Z[-2]` -> `2025-01-01T12:00:00+00:00`, or None if it is no stamp."""
    try:
        t = datetime.datetime.strptime(stamp.split("-")[0], "%Y%m%dT%H%M%SZ")
    except ValueError:
        return None
    return t.replace(tzinfo=datetime.timezone.utc).isoformat()


def human_time(iso):
    return iso.replace("T", " ").replace("+00:00", "Z")[:20] if iso else "?"


def human_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def rows(listing):
    """Host listing -> JSON-ready records (oldest first)."""
    out = []
    for r in listing["releases"]:
        ex = r.get("exit") or {}
        sha = r.get("profile_sha256")
        out.append({
            "release": r["release"], "current": r["current"],
            "profile_sha": sha[:12] if sha else None,
            "started_at": r.get("started_at") or stamp_time(r["release"]),
            "ended": describe_end(r), "returncode": ex.get("returncode"),
            "ended_at": ex.get("ended_at"), "log_bytes": r.get("log_bytes"),
            "running": bool(r.get("running")),
            # its start, if a deploy waited for it (tasks/startup/estimate.py): time to ready, phases
            "ready_s": (r.get("startup") or {}).get("ready_s"),
            "startup": (r.get("startup") or {}).get("phases"),
            "compile_cache": (r.get("startup") or {}).get("compile_cache"),
            # a release that did not start: why (release/host/launch.py, tasks/steps/wait.py)
            "failed": r.get("start_failed"),
        })
    return out


def table_lines(records):
    head = ["", "release", "profile", "started", "ready in", "ended", "log"]
    body = [["*" if r["current"] else "", r["release"], r["profile_sha"] or "-",
             human_time(r["started_at"]), _ready(r), r["ended"], human_bytes(r["log_bytes"])]
            for r in records]
    return output.table_lines(head, body)


def _ready(rec):
    """Time to ready of the release's start, with its compile cache: `45.7 s (warm)`."""
    if rec.get("ready_s") is None:
        return "-"
    return f"{rec['ready_s']:.1f} s" + (f" ({rec['compile_cache']})" if rec.get("compile_cache") else "")


def previous_release(releases, current):
    """The newest release older than `current` that ran (has a log and a launcher) and did not
    fail to start (a deploy that failed marks its release), or None."""
    names = [r["release"] for r in releases]
    if current not in names:
        return None
    for r in reversed(releases[:names.index(current)]):
        if r.get("log_bytes") is not None and r.get("has_launcher", True) \
                and not r.get("start_failed"):
            return r["release"]
    return None


class _AnyEnv(dict):
    """Secrets are not needed to read an old profile: the release has its secrets.json."""

    def __contains__(self, key):
        return True

    def __missing__(self, key):
        return "<redacted>"


def saved_profile(text, fallback):
    """The old release's profile (for readiness settings), or `fallback` if it cannot be read."""
    if not text:
        return fallback
    from .profile import load_profile, tomllib
    from .profile.toml_text import dumps
    try:
        data = tomllib.loads(text)
        data.get("server", {}).pop("files", None)  # local copies; the release has its own
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "profile.toml")
            with open(path, "w") as f:
                f.write(dumps(data))
            return load_profile(path, environ=_AnyEnv())
    except Exception:  # an older llmfab's format: readiness from the given profile instead
        return fallback


def releases(c, opts):
    """Body of `fab releases` (opts: tasks.options.ReleasesOptions)."""
    from .fleet.runner import load, run_task
    from .steps.lock import take_lock
    from .steps.preflight import deploy_dir
    profile = load(c, opts.profile)
    keep = opts.keep
    json_mode = opts.json
    ddir = deploy_dir(profile)

    def op(host, reporter):
        host.start()
        if keep is not None and not take_lock(host, ddir, "releases --keep", create=False).get("absent"):
            pruned = host.call("prune", deploy_dir=ddir, keep=keep)["pruned"]
            reporter.line(host.name, f"pruned {len(pruned)} release(s)"
                                     + (f": {', '.join(pruned)}" if pruned else ""))
        listing = host.call("release_list", deploy_dir=ddir)
        records = rows(listing)
        if json_mode:
            reporter.emit_json({"host": host.name, "ok": True, "deploy_dir": listing["deploy_dir"],
                                "current": listing["current"], "releases": records})
        elif records:
            reporter.lines(host.name, table_lines(records))
        else:
            reporter.line(host.name, f"no releases in {listing['deploy_dir']}")
        return HostResult(host.name, 0, f"{len(records)} release(s), current {listing['current']}")
    run_task(c, profile, op, opts, title="releases", json_mode=json_mode)


def rollback_host(host, profile, opts, reporter, to=None, spot=None, spots=None):
    """Relaunch the release before `current` (or `to`: a rolling deploy names the one that
    ran before it, which differs when a failed release lies in between; `fab rollback
    --release`). A release that did not start is never relaunched. `spot`/`spots`
    (tasks/interrupts.py): where a Ctrl-C leaves this host."""
    from .interrupts import Spot, changing
    from .failures.failed_server import raise_launch_failed
    from .steps.shutdown import stop_deployment
    from .steps.lock import take_lock
    from .steps.preflight import deploy_dir
    from .steps.wait import wait_or_clean_up
    name, ddir = host.name, deploy_dir(profile)
    if spot is None:
        spot = Spot()
    if spots is not None:
        spots[name] = spot
    hello = host.start()
    take_lock(host, ddir, "rollback", create=False)  # nothing deployed: the listing says so
    listing = host.call("release_list", deploy_dir=ddir)
    current = listing["current"]
    running = [r["release"] for r in listing["releases"] if r.get("running")]
    spot.old = running[0] if running else None
    if current is None:
        raise OperationFailed(f"nothing deployed in {ddir}: no release to roll back from")
    prev = to or previous_release(listing["releases"], current)
    by_name = {r["release"]: r for r in listing["releases"]}
    if to is not None and to not in by_name:
        raise OperationFailed(f"release {to} is no longer kept in {ddir}; nothing was changed")
    if to is not None and by_name[to].get("start_failed"):
        failed = by_name[to]["start_failed"]
        raise OperationFailed(f"release {to} did not start ({failed.get('rule')}: {failed.get('cause')}); "
                              "it is never relaunched; nothing was changed")
    if prev is None:
        ran = [r["release"] for r in listing["releases"]]
        raise OperationFailed(f"no release before {current} to roll back to in {ddir} "
                              f"(releases: {', '.join(ran)}); nothing was changed")
    saved = host.call("release_profile", deploy_dir=ddir, release=prev)["profile_toml"]
    old = saved_profile(saved, profile)
    if old is profile:
        reporter.line(name, f"note: {prev}/profile.toml unreadable; readiness settings come "
                            f"from {profile.path.name}")
    # Hints such as `fab stop --profile ...` must name the user's file, not a temporary copy.
    old = replace(old, path=profile.path)
    spot.new = prev
    reporter.line(name, f"rolling back from {current} to {prev}")
    stop_deployment(host, ddir, reporter, by="fab rollback", spot=spot)
    # The old release's gpu-baseline.json is from its first launch: take today's, so
    # `fab stop` waits for what the GPUs hold now without this server.
    with changing(), raise_launch_failed(prev):
        spot.step = "launching"
        launched = host.batch({
            "baseline": ("gpu_baseline", dict(deploy_dir=ddir, release=prev, nvidia_smi=old.gpu.nvidia_smi,
                                  devices=old.devices)),
            "relaunch": ("relaunch", dict(deploy_dir=ddir, release=prev, python=host_python(old))),
            "waiting": ("lock_phase", dict(deploy_dir=ddir, phase="waiting")),  # `fab stop` may end the wait
        }, timeout=120)["relaunch"]
        server = launched["server"]
        spot.step, spot.pid = "launched", server["pid"]
    reporter.line(name, f"relaunched release {prev}: pid {server['pid']}, "
                        f"log {listing['deploy_dir']}/releases/{prev}/server.log")
    result = HostResult(name, 0, f"relaunched {prev} (pid {server['pid']})",
                        {"release": prev, "pid": server["pid"]})
    if opts.no_wait:
        return result
    if server.get("port") is not None and server["port"] != old.server.port:
        old = replace(old, server=replace(old.server, port=server["port"]))
    facts = wait_or_clean_up(host, old, ddir, server, reporter, task="rollback",
                             timeout=opts.timeout, log_offset=launched.get("log_offset", 0),
                             stale_agent=hello.get("pid"))
    reporter.line(name, f"ready in {facts['seconds']:.1f} s: release {prev} on port {old.server.port}")
    result.summary = f"rolled back to {prev}, ready in {facts['seconds']:.1f} s"
    from .startup import estimate  # this start's phases, kept in the release as its deploy's were
    rec, slower = estimate.record(host, old, ddir, server, facts, None, reporter,
                                 log_offset=launched.get("log_offset", 0))
    result.data.update(ready_s=round(facts["seconds"], 3), startup=rec["phases"],
                       compile_cache=rec["compile_cache"], findings=slower)
    return result


def rollback(c, opts):
    """Body of `fab rollback` (opts: tasks.options.RollbackOptions)."""
    from .failures.failed_server import reporting_json
    from .fleet.runner import load, run_task
    from .interrupts import left_lines
    from .output import fab_hint
    profile = load(c, opts.profile)
    spots = {}
    op = reporting_json(lambda h, r: rollback_host(h, profile, opts, r, to=opts.release, spots=spots),
                        opts.json)
    run_task(c, profile, op, opts, title="rollback", json_mode=opts.json,
             on_interrupt=lambda: left_lines(spots, lambda t: fab_hint(profile, t)))
