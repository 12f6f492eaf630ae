"""`fab pull`: the weights the profile's `[weights]` names, onto every host, verified.

1. The source's files are listed with size and sha256 (tasks/weights/local.py); a hub
   source is first fetched onto this machine at one commit and verified (tasks/weights/hub.py).
2. Each host says what it holds (op weights_plan: verified, partial, wrong, free space);
   a host short of space fails alone (exit 1, naming the bytes), the others go on.
3. The copies (tasks/weights/schedule.py): this machine sends each file about once, and
   hosts holding a verified copy feed the others over SSH with a key made for this pull,
   authorised on the hosts only from the pull's hosts, only as the receiver, with an
   expiry, and removed in `finally` (and by the next pull at the latest).
4. Every file lands as `.NAME.llmfab-part`, resumes from what is there, and is renamed to
   NAME only once its size and sha256 match (tasks/weights/host/receiver.py); then manifest.json.
"""
import fnmatch
import os
import secrets
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..errors import ExitCode, LlmfabError, OperationFailed, TaskFailed, UsageError
from ..fleet.fanout import HostResult, each, emit_missing, error_record, run_all, summarize, worst
from ..fleet.runner import host_kwargs, hosts_for, load, run_fleet
from ..base.host.hosterrors import error_words
from ..output import Reporter
from ..transport.agent import Host
from . import hub
from .copies import copy_all, mib, nfiles, small_first
from .local import list_files
from .schedule import Fanout

KEY_LIFETIME = timedelta(hours=6)   # the expiry-time= of the pull's key (removed long before)
SPARE = 64 << 20                    # bytes a host must keep free beyond the files
SHOWN = 5                           # names a line lists before "and N more"

# Files the source lacks that change what the engine loads: a FAIL, not a WARN. vLLM's
# loader (model_executor/model_loader/default_loader.py, 0.32) globs the model directory's
# top level for *.safetensors, else *.bin, and keeps only the shards the index names when
# model.safetensors.index.json is there (weight_utils.filter_duplicate_safetensors_files);
# so an extra top-level shard is loaded as weights unless the source has what `safe_if` names.
LOADED_EXTRAS = (
    {"glob": "*.safetensors", "safe_if": "model.safetensors.index.json",
     "why": "vLLM loads every *.safetensors at the top of a model directory that has no "
            "model.safetensors.index.json"},
    {"glob": "*.bin", "safe_if": "*.safetensors",
     "why": "vLLM loads every *.bin at the top of a model directory that has no *.safetensors"},
)


class _HostState:
    def __init__(self, host):
        self.host = host
        self.name = host.name
        self.lock = threading.Lock()
        self.plan = None
        self.need = 0
        self.received = 0
        self.landed = 0             # bytes of files verified there (of `need`)
        self.prepared = None
        self.source_changed = None
        self.files_received = 0
        self.by_sender = {}
        self.started = None
        self.error = None
        self.already = 0
        self.bad = []
        self.removed = []
        self.extra = []


def pull(c, opts):
    """Body of `fab pull` (see the module docstring)."""
    profile = load(c, opts.profile)
    if not profile.weights:
        raise UsageError(f"{profile.sources[0] if profile.sources else 'the profile'}: no [weights] "
                         "table: add `\"<model path on the host>\" = \"hf://ORG/NAME@REV\"` (or \"local:/dir/here\") "
                         "under [weights]")
    names = hosts_for(c, profile)
    reporter = Reporter(names, json_mode=opts.json)
    dirs = []
    try:
        for w in profile.weights:
            if w.hub:
                commit, listed = hub.list_files(w, lambda text: reporter.line("", text), opts.verify)
            else:
                commit, listed = None, list_files(w.source, w.local, fresh=opts.verify)
            dirs.append({"path": w.path, "source": w.source, "commit": commit, "files": listed})
        _nest(dirs)
    except OperationFailed as e:  # the hub refused or a file did not verify: no host gets it
        if opts.json:  # one object per host, as always; the message once, on stderr
            for n in names:
                reporter.emit_json(error_record(n, e))
        raise
    files = {(d["path"], f["path"]): f for d in dirs for f in d["files"]}
    for d in dirs:
        reporter.line("", f"{d['source']}: {len(d['files'])} files, "
                          f"{mib(sum(f['size'] for f in d['files']))} -> {d['path']}")
    kw = host_kwargs(c, profile, opts)
    states = {n: _HostState(Host(n, **kw)) for n in names}
    pull_id = secrets.token_hex(6)

    def interrupted():  # the key goes on fresh connections: the task's may be mid-request
        return _revoke(names, pull_id, lambda n: Host(n, **kw), close=True)

    try:  # Ctrl-C ends the process in run_fleet, once `interrupted` has run
        ordered = run_fleet(lambda: _on_hosts(states, names, dirs, files, pull_id, opts, reporter),
                            reporter, on_interrupt=interrupted, note=_interrupt_note)
    finally:  # the pull's key, receiver and locks: its own only, never another pull's
        started = [n for n in names if states[n].prepared]
        for n, text in _revoke(started, pull_id, lambda n: states[n].host):
            reporter.line(n, text)
        for st in states.values():
            st.host.close()
    if opts.json:
        emit_missing(reporter, ordered)
    summarize(reporter, ordered, "pull")
    code = worst(r.code for r in ordered)
    if code:
        raise TaskFailed(int(code))
    return ordered


def _interrupt_note():
    from ..interrupts import words
    return (f"interrupted ({words()}): partial files stay as .NAME.llmfab-part (the next pull "
            "resumes them); no half file has a final name")


def _on_hosts(states, names, dirs, files, pull_id, opts, reporter):
    """The pull's steps on its hosts (tasks/fleet/fanout.py runs each): plan every host, grant
    the pull's key, the small files, the copies, then each host's manifest. -> [HostResult]
    in host order."""
    hosts = {n: st.host for n, st in states.items()}
    t0 = time.monotonic()
    planned = run_all(names, lambda h: _plan(states[h.name], dirs, pull_id, opts.verify, reporter),
                      parallel=opts.parallel, reporter=reporter, opened=hosts)
    results = {r.host: r for r in planned if r.code}
    live = [n for n in names if n not in results]
    needs = {n: {(d["path"], f["path"]): f["part"] for d in states[n].plan["dirs"]
                 for f in d["files"] if not f["ok"]} for n in live}
    senders = {n for n in live if _can_feed(states[n])}
    granted = []
    if len(senders) > 1 and any(needs[n] for n in live):
        _grant(states, sorted(senders), pull_id, reporter, granted)
    small_first(states, needs, files, pull_id, reporter)
    fan = Fanout(sizes={k: f["size"] for k, f in files.items()}, needs=needs,
                 can_send=senders if granted else set())
    copy_all(fan, states, files, pull_id, reporter)
    for r in run_all(live, lambda h: _finish(states[h.name], fan, dirs, opts, reporter, t0),
                     parallel=opts.parallel, reporter=reporter, opened=hosts):
        results[r.host] = r
    return [results[n] for n in names]


def _counted(err, st):
    """`err` with what reached the host before it, in its --json object."""
    err.json_extra = dict(getattr(err, "json_extra", None) or {},
                          bytes_received=st.received, files_received=st.files_received)
    return err


def _plan(st, dirs, pull_id, verify, reporter):
    """Connect, read what the host holds, check its space, prepare it. -> HostResult (ok);
    its error as raised (the host is out of the pull)."""
    st.host.start()
    st.host.call("weights_lock", pull=pull_id, paths=[d["path"] for d in dirs], timeout=60)
    st.plan = st.host.call("weights_plan", verify=verify, timeout=None, dirs=[
        {"path": d["path"], "files": [{k: f[k] for k in ("path", "size", "sha256")}
                                      for f in d["files"]]} for d in dirs])
    for d, mine in zip(dirs, st.plan["dirs"]):
        st.need += mine["need"]
        st.already += sum(1 for f in mine["files"] if f["ok"])
        st.bad += [f"{d['path']}/{f['path']}" for f in mine["files"] if f["bad"]]
        if mine["need"] and mine["need"] + SPARE > mine["free"]:
            raise OperationFailed(
                f"not enough space for {d['path']}: it needs {mine['need']} bytes "
                f"({mib(mine['need'])}) more, {mine['free']} bytes ({mib(mine['free'])}) "
                f"are free there, and a pull keeps {mib(SPARE)} free beyond the files "
                f"(short by {mib(mine['need'] + SPARE - mine['free'])}): free some, or point "
                "[weights] at a larger disk")
    for path in st.bad:
        reporter.line(st.name, f"{path}: present but wrong (size or sha256); fetching it again")
    resumed = sum(f["part"] for d in st.plan["dirs"] for f in d["files"] if not f["ok"])
    if st.need:
        reporter.line(st.name, f"needs {mib(st.need)}"
                               + (f" (resuming {mib(resumed)} already here)" if resumed else ""))
    st.prepared = st.host.call("weights_prepare", pull=pull_id,
                               dirs=[{"path": d["path"], "need": mine["need"], "subdirs": sorted(
                                   {os.path.dirname(f["path"]) for f in d["files"]} - {""})}
                                     for d, mine in zip(dirs, st.plan["dirs"])], timeout=60)
    st.user = st.host.hello["user"]
    st.python = st.host.hello["executable"]
    return HostResult(st.name)


def _finish(st, fan, dirs, opts, reporter, t0):
    """A host whose copies ended: its manifest in each directory, what the pull removed and
    left there. -> its HostResult; its error as raised (with the bytes it received)."""
    if st.name in fan.failed:
        raise _counted(OperationFailed(fan.failed[st.name]), st)
    loaded = []
    try:
        for d in dirs:
            kept = st.host.call("weights_manifest", path=d["path"], source=d["source"],
                                commit=d["commit"], inner=d["inner"], timeout=None,
                                files=[{k: f[k] for k in ("path", "size", "sha256")}
                                       for f in d["files"]])
            loaded += _leftovers(reporter, st, d, kept)
    except LlmfabError as e:
        raise _counted(e, st) from None
    return _done(reporter, st, dirs, opts, time.monotonic() - t0, loaded)


def _can_feed(st):
    return not st.host.local and st.plan.get("ip") is not None


def _known_host_line(st):
    kind, key = st.host.server_key()
    ip, port = st.plan["ip"], st.plan["port"]
    name = ip if port == 22 else f"[{ip}]:{port}"
    return f"{name} {kind} {key}"


def _grant(states, senders, pull_id, reporter, granted):
    """The pull's key pair, made here; its public half authorised on each host for the
    senders' addresses only, its private half on each sender."""
    with tempfile.TemporaryDirectory(prefix="llmfab-pull-") as tmp:
        key = os.path.join(tmp, "key")
        try:
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llmfab-pull",
                            "-f", key], check=True, stdin=subprocess.DEVNULL, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            why = (error_words(e) if isinstance(e, OSError) else
                   (e.stderr or b"").decode("utf-8", "replace").strip() or f"exit status {e.returncode}")
            reporter.line("", f"cannot make the pull's SSH key (ssh-keygen: {why}); every host gets "
                              "the files from here")
            return
        private, public = Path(key).read_text(), Path(key + ".pub").read_text().split()
    expiry = (datetime.now(timezone.utc) + KEY_LIFETIME).strftime("%Y%m%d%H%M")
    known = [_known_host_line(states[n]) for n in senders]
    ips = sorted({states[n].plan["ip"] for n in senders})
    for n in senders:
        try:
            with states[n].lock:
                states[n].host.call("weights_grant", pull=pull_id, public=" ".join(public[:2]),
                                    private=private, sources=ips, expiry=expiry,
                                    known_hosts=known, timeout=60)
            granted.append(n)
        except LlmfabError as e:
            reporter.line(n, f"cannot authorise the pull's key here ({e.message}); "
                             "it gets the files from this machine")
    if len(granted) < 2:
        del granted[:]


def _revoke(names, pull_id, host_of, close=False):
    """Remove the pull's key, receiver and locks from each host (its own only, never another
    pull's), on `host_of(name)` (`close`: a connection made for this). -> [(host, line)]
    where that failed."""
    def one(n):
        host = host_of(n)
        try:
            host.call("weights_revoke", pull=pull_id, timeout=30)
        except LlmfabError as e:
            return (n, f"could not remove the pull's key ({e.message}); the next pull "
                       "removes it, and it expires by itself")
        finally:
            if close:
                host.close()
    return [said for said in each(names, one, parallel=32) if said]


def _nest(dirs):
    """Destinations inside another (model /m, drafter /m/drafter) are one plan: each dir's
    `inner` names the destinations nested in it (relative), whose files are theirs (never
    an outer's extra, leftover or manifest entry). A file the outer source has under an inner
    destination comes from the inner's source: the same bytes there are dropped from the
    outer's list, different ones are refused (exit 2) naming both sources."""
    for d in dirs:
        d["inner"] = sorted(os.path.relpath(o["path"], d["path"]) for o in dirs
                            if o is not d and o["path"].startswith(d["path"].rstrip("/") + "/"))
    for d in dirs:
        clash = []
        for rel in d["inner"]:
            theirs = next(o for o in dirs if o["path"] == os.path.join(d["path"], rel))
            shas = {f["path"]: f["sha256"] for f in theirs["files"]}
            kept = []
            for f in d["files"]:
                if not f["path"].startswith(rel + "/"):
                    kept.append(f)
                elif shas.get(f["path"][len(rel) + 1:]) != f["sha256"]:
                    clash.append(f"{d['path']}/{f['path']}")
            d["files"] = kept
        if clash:
            raise UsageError(
                f"[weights]: {d['source']} ({d['path']}) holds {_names(clash)}, inside another "
                f"destination of this profile whose source has other bytes under that name: one "
                "file, two sources. Remove it from one of the sources (or give the outer source "
                "without the inner directory)")


def _names(paths):
    shown = ", ".join(paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def _leftovers(reporter, st, d, kept):
    """Say what the pull removed from directory `d` (files of the earlier pull the source
    lacks) and what it left (files the source lacks that llmfab did not put there: never
    deleted). -> the left files the engine would load as weights (LOADED_EXTRAS), as
    (path, why)."""
    root, names = d["path"], [f["path"] for f in d["files"]]
    removed = [f"{root}/{rel}" for rel in kept.get("removed", ())]
    extra = [f"{root}/{rel}" for rel in kept.get("extra", ())]
    st.removed += removed
    st.extra += extra
    if removed:
        reporter.line(st.name, f"removed {nfiles(len(removed))} of the earlier pull not in the "
                               f"source: {_names(removed)}")
    loaded = [(f"{root}/{rel}", rule["why"]) for rel in kept.get("extra", ()) for rule in LOADED_EXTRAS
              if "/" not in rel and fnmatch.fnmatch(rel, rule["glob"])
              and not any(fnmatch.fnmatch(n, rule["safe_if"]) for n in names if "/" not in n)]
    if extra:
        reporter.line(st.name, f"WARN: {nfiles(len(extra))} not in the source that llmfab did not "
                               f"put there, left in place: {_names(extra)}; remove them by hand or "
                               f"move them out of {root}")
    return loaded


def _done(reporter, st, dirs, opts, seconds, loaded=()):
    rec = {"host": st.name, "ok": True,
           "dirs": [{"path": d["path"], "source": d["source"], "commit": d["commit"],
                     "files": len(d["files"]), "bytes": sum(f["size"] for f in d["files"])}
                    for d in dirs],
           "files_present": st.already, "files_received": st.files_received,
           "bytes_received": st.received, "from": st.by_sender, "refetched": st.bad,
           "verified": bool(opts.verify), "seconds": round(seconds, 3),
           "removed": st.removed, "extra_files": st.extra}
    if loaded:
        paths = [p for p, _ in loaded]
        them = "it" if len(paths) == 1 else "them"
        err = _counted(OperationFailed(
            f"{_names(paths)}: not in the source and not put there by llmfab; {loaded[0][1]}, so "
            f"the engine would load {them} as weights of this model: move {them} out of the "
            "directory (or remove by hand), then `fab pull` again"), st)
        err.json_extra.update({k: rec[k] for k in ("dirs", "removed", "extra_files")})
        raise err
    if st.files_received:
        summary = f"{st.files_received} files, {mib(st.received)} received"
    else:
        summary = "up to date: 0 bytes sent"
    if st.extra:
        summary += f"; WARN: {nfiles(len(st.extra))} not in the source left in place"
    reporter.line(st.name, f"{summary}; " + ", ".join(
        f"{d['path']} verified ({len(d['files'])} files)" for d in dirs))
    if opts.json:
        reporter.emit_json(rec)
    return HostResult(st.name, ExitCode.OK, summary)
