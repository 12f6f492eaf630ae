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
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..errors import ExitCode, LlmfabError, OperationFailed, TaskFailed, UsageError
from ..fleet.fanout import HostResult, emit_missing, error_record, summarize, worst
from ..fleet.runner import host_kwargs, hosts_for, load
from ..base.host.hosterrors import error_words
from ..output import Reporter, report_error
from ..transport.agent import Host
from . import hub, send
from .local import forget, list_files
from .schedule import SMALL, SOURCE, Fanout

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


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB" if n < (1 << 30) else f"{n / (1 << 30):.2f} GiB"


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
                          f"{_mib(sum(f['size'] for f in d['files']))} -> {d['path']}")
    kw = host_kwargs(c, profile, opts)
    states = {n: _HostState(Host(n, **kw)) for n in names}
    pull_id = secrets.token_hex(6)
    results = {}
    granted = []
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(opts.parallel, len(names)))) as pool:
            for name, err in zip(names, pool.map(
                    lambda n: _plan(states[n], dirs, pull_id, opts.verify, reporter), names)):
                if err is not None:
                    results[name] = _failed(reporter, name, err)
        live = [n for n in names if n not in results]
        needs = {n: {(d["path"], f["path"]): f["part"] for d in states[n].plan["dirs"]
                     for f in d["files"] if not f["ok"]} for n in live}
        senders = {n for n in live if _can_feed(states[n])}
        receivers = [n for n in live if needs[n]]
        if len(senders) > 1 and receivers:
            _grant(states, sorted(senders), pull_id, reporter, granted)
        _small_first(states, needs, files, pull_id, reporter)
        fan = Fanout(sizes={k: f["size"] for k, f in files.items()}, needs=needs,
                     can_send=senders if granted else set())
        _copy(fan, states, files, pull_id, reporter, t0)
        for n in live:
            st = states[n]
            if n in fan.failed:
                results[n] = _failed(reporter, n, OperationFailed(fan.failed[n]), st)
                continue
            loaded = []
            try:
                for d in dirs:
                    kept = st.host.call("weights_manifest", path=d["path"], source=d["source"],
                                        commit=d["commit"], inner=d["inner"], files=[{k: f[k] for k in ("path", "size", "sha256")}
                                                                   for f in d["files"]], timeout=None)
                    loaded += _leftovers(reporter, st, d, kept)
            except LlmfabError as e:
                results[n] = _failed(reporter, n, e, st)
                continue
            results[n] = _done(reporter, st, dirs, opts, time.monotonic() - t0, loaded)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (tasks/interrupts.py)
        from ..interrupts import exit_status, words
        reporter.line("", f"interrupted ({words()}): partial files stay as .NAME.llmfab-part "
                          "(the next pull resumes them); no half file has a final name")
        _revoke(names, kw, pull_id, reporter, fresh=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_status())  # copies in flight run in threads; the sockets close with us
    finally:
        started = [n for n in names if getattr(states[n], "prepared", None)]
        if started:  # the pull's key, receiver and locks: its own only, never another pull's
            _revoke(started, kw, pull_id, reporter, states=states)
        for st in states.values():
            st.host.close()
    ordered = [results[n] for n in names]
    if opts.json:
        emit_missing(reporter, ordered)
    summarize(reporter, ordered, "pull")
    code = worst(r.code for r in ordered)
    if code:
        raise TaskFailed(int(code))
    return ordered


def _failed(reporter, name, err, st=None):
    report_error(reporter, name, err)
    rec = error_record(name, err)
    if st is not None:
        rec.update(bytes_received=st.received, files_received=st.files_received)
    msg = err.message.splitlines()[0] if err.message else ""
    return HostResult(name, int(err.code), msg[:100], json=rec)


def _plan(st, dirs, pull_id, verify, reporter):
    """Connect, read what the host holds, check its space, prepare it. -> None or the error."""
    try:
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
                    f"({_mib(mine['need'])}) more, {mine['free']} bytes ({_mib(mine['free'])}) "
                    f"are free there, and a pull keeps {_mib(SPARE)} free beyond the files "
                    f"(short by {_mib(mine['need'] + SPARE - mine['free'])}): free some, or point "
                    "[weights] at a larger disk")
        for path in st.bad:
            reporter.line(st.name, f"{path}: present but wrong (size or sha256); fetching it again")
        resumed = sum(f["part"] for d in st.plan["dirs"] for f in d["files"] if not f["ok"])
        if st.need:
            reporter.line(st.name, f"needs {_mib(st.need)}"
                                   + (f" (resuming {_mib(resumed)} already here)" if resumed else ""))
        st.prepared = st.host.call("weights_prepare", pull=pull_id,
                                   dirs=[{"path": d["path"], "need": mine["need"], "subdirs": sorted(
                                       {os.path.dirname(f["path"]) for f in d["files"]} - {""})}
                                         for d, mine in zip(dirs, st.plan["dirs"])], timeout=60)
        st.user = st.host.hello["user"]
        st.python = st.host.hello["executable"]
        return None
    except LlmfabError as e:
        return e


def _can_feed(st):
    return not st.host.local and st.plan.get("ip") is not None


def _known_host_line(st):
    key = st.host.cxn.client.get_transport().get_remote_server_key()
    ip, port = st.plan["ip"], st.plan["port"]
    name = ip if port == 22 else f"[{ip}]:{port}"
    return f"{name} {key.get_name()} {key.get_base64()}"


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


def _revoke(names, kw, pull_id, reporter, states=None, fresh=False):
    def one(n):
        host = Host(n, **kw) if fresh or states is None else states[n].host
        try:
            host.call("weights_revoke", pull=pull_id, timeout=30)
        except LlmfabError as e:
            reporter.line(n, f"could not remove the pull's key ({e.message}); the next pull "
                             "removes it, and it expires by itself")
        finally:
            if fresh:
                host.close()
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(names)))) as pool:
        list(pool.map(one, names))


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


def _small_first(states, needs, files, pull_id, reporter):
    """Whole small files (at most SMALL bytes, none partly there) go from here first, in
    batches: one SSH session and one receiver per batch (send.batch), every host at once.
    What lands leaves `needs`; what does not stays there for the file-by-file copies."""
    def one_host(n):
        st = states[n]
        small = [k for k, off in needs[n].items() if off == 0 and files[k]["size"] <= SMALL]
        by_root = {}
        for k in sorted(small):
            by_root.setdefault(k[0], []).append(k)
        if len(small) < 2:
            return
        for root, keys in by_root.items():
            for group in send.batches(keys, files):
                try:
                    got, secs = send.batch(st, root, [files[k] for k in group], pull_id)
                except (LlmfabError, OSError) as e:
                    reporter.line(n, f"a batch of {_files(len(group))} from here failed "
                                     f"({getattr(e, 'message', None) or error_words(e)}); "
                                     "sending them one by one")
                    return
                landed = [k for k in group if got[k[1]].get("ok")]
                with st.lock:
                    st.received += sum(a.get("bytes", 0) for a in got.values())
                    st.landed += sum(files[k]["size"] for k in landed)
                    st.files_received += len(landed)
                    st.by_sender["here"] = st.by_sender.get("here", 0) + sum(
                        a.get("bytes", 0) for a in got.values())
                for k in landed:
                    del needs[n][k]
                changed = [a for a in got.values() if a.get("kind") == "source"]
                if changed:
                    for k in group:
                        if got[k[1]].get("kind") == "source":
                            forget(files[k]["local"])
                    st.source_changed = changed[0]["reason"]
                    return
                size = sum(files[k]["size"] for k in landed)
                reporter.line(n, f"{_files(len(landed))} ({_mib(size)}) from here in one batch, "
                                 f"{secs:.1f} s; {_mib(st.landed)} of {_mib(st.need)}")
    live = [n for n in needs if needs[n]]
    for n in live:
        states[n].started = states[n].started or time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(live)))) as pool:
        list(pool.map(one_host, live))


def _copy(fan, states, files, pull_id, reporter, t0):
    """Run the copies the schedule starts until every host has its files (or failed)."""
    done = queue.Queue()
    running = 0
    for n in fan.needs:
        states[n].started = states[n].started or time.monotonic()
        if getattr(states[n], "source_changed", None):
            fan.failed[n] = states[n].source_changed
    while True:
        for sender, host, key, offset in fan.next_copies():
            running += 1
            threading.Thread(target=_one_copy, daemon=True, args=(
                done, states, sender, host, key, offset, files[key], pull_id)).start()
        if running == 0:
            break
        while True:
            try:
                sender, host, key, offset, answer = done.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        running -= 1
        st = states[host]
        st.received += answer.get("bytes", 0)
        who = "here" if sender is SOURCE else sender
        st.by_sender[who] = st.by_sender.get(who, 0) + answer.get("bytes", 0)
        if answer.get("ok"):
            st.files_received += 1
            st.landed += files[key]["size"] - offset
            _progress(reporter, st, key, who, answer, files[key]["size"])
            fan.finished(sender, host, key, True)
        else:
            fatal = None
            if answer.get("kind") in ("disk_full", "host", "source"):
                fatal = answer["reason"]
            if answer.get("kind") == "source":
                forget(files[key]["local"])
            reporter.line(host, f"{key[1]} from {who}: {answer.get('reason')}"
                                + ("" if fatal else "; trying again"))
            fan.finished(sender, host, key, False, fatal=fatal,
                         offset=0 if answer.get("kind") == "corrupt" else _part_after(offset, answer))
    return fan


def _part_after(offset, answer):
    return offset + answer.get("bytes", 0) if answer.get("kind") in (None, "short") else 0


ETA_AFTER = 2.0  # seconds of copying before a time left is guessed (a first small file says nothing)


def _progress(reporter, st, key, who, answer, size):
    """One line per file received: the host's bytes landed (never more than it needs), the
    rate over the copy so far, and the time left once that rate means something."""
    spent = max(time.monotonic() - st.started, 1e-6)
    landed = min(st.landed, st.need)
    rate = landed / spent
    left = st.need - landed
    eta = f", ~{left / rate:.0f} s left" if left and rate > 0 and spent >= ETA_AFTER else ""
    secs = max(answer.get("seconds") or 0.0, 1e-6)
    reporter.line(st.name, f"{key[1]} ({_mib(size)}) from {who} in {secs:.1f} s "
                           f"({answer.get('bytes', 0) / secs / 1e6:.0f} MB/s); "
                           f"{_mib(landed)} of {_mib(st.need)} at {rate / 1e6:.0f} MB/s{eta}")


def _one_copy(done, states, sender, host, key, offset, f, pull_id):
    order = {"root": key[0], "file": {k: f[k] for k in ("path", "size", "sha256")}, "offset": offset}
    try:
        if sender is SOURCE:
            answer = send.one(states[host], order, f["local"], pull_id)
        else:
            src, dst = states[sender], states[host]
            answer = src.host.call("weights_send", pull=pull_id, root=key[0], file=order["file"],
                                   offset=offset, timeout=None,
                                   peer={"ip": dst.plan["ip"], "port": dst.plan["port"],
                                         "user": dst.user})
    except LlmfabError as e:
        answer = {"ok": False, "bytes": 0, "reason": e.message, "kind": "host" if sender is SOURCE else None}
    except Exception as e:  # a copy's own failure stays with its host
        answer = {"ok": False, "bytes": 0, "reason": error_words(e)}
    done.put((sender, host, key, offset, answer))


def _names(paths):
    shown = ", ".join(paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def _files(n):
    return f"{n} file" if n == 1 else f"{n} files"


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
        reporter.line(st.name, f"removed {_files(len(removed))} of the earlier pull not in the "
                               f"source: {_names(removed)}")
    loaded = [(f"{root}/{rel}", rule["why"]) for rel in kept.get("extra", ()) for rule in LOADED_EXTRAS
              if "/" not in rel and fnmatch.fnmatch(rel, rule["glob"])
              and not any(fnmatch.fnmatch(n, rule["safe_if"]) for n in names if "/" not in n)]
    if extra:
        reporter.line(st.name, f"WARN: {_files(len(extra))} not in the source that llmfab did not "
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
        err = OperationFailed(
            f"{_names(paths)}: not in the source and not put there by llmfab; {loaded[0][1]}, so "
            f"the engine would load {them} as weights of this model: move {them} out of the "
            "directory (or remove by hand), then `fab pull` again")
        result = _failed(reporter, st.name, err, st)
        result.json.update({k: rec[k] for k in ("dirs", "removed", "extra_files")})
        return result
    if st.files_received:
        summary = f"{st.files_received} files, {_mib(st.received)} received"
    else:
        summary = "up to date: 0 bytes sent"
    if st.extra:
        summary += f"; WARN: {_files(len(st.extra))} not in the source left in place"
    reporter.line(st.name, f"{summary}; " + ", ".join(
        f"{d['path']} verified ({len(d['files'])} files)" for d in dirs))
    if opts.json:
        reporter.emit_json(rec)
    return HostResult(st.name, ExitCode.OK, summary)
