"""The copies of `fab pull` (tasks/weights/pull.py), once every host is planned: the small
files in batches from here, then file by file as the schedule (tasks/weights/schedule.py)
starts them, from here or from a host that holds a verified copy, each copy on a worker
thread of the fleet's (tasks/fleet/fanout.py `flow`), its answer handed back here; and
each host's progress line.
"""
import time

from ..errors import LlmfabError
from ..fleet.fanout import each, flow
from ..base.host.hosterrors import error_words
from . import send
from .local import forget
from .schedule import SMALL, SOURCE


def mib(n):
    return f"{n / (1 << 20):.1f} MiB" if n < (1 << 30) else f"{n / (1 << 30):.2f} GiB"


def nfiles(n):
    return f"{n} file" if n == 1 else f"{n} files"


def small_first(states, needs, files, pull_id, reporter):
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
                    reporter.line(n, f"a batch of {nfiles(len(group))} from here failed "
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
                reporter.line(n, f"{nfiles(len(landed))} ({mib(size)}) from here in one batch, "
                                 f"{secs:.1f} s; {mib(st.landed)} of {mib(st.need)}")
    live = [n for n in needs if needs[n]]
    for n in live:
        states[n].started = states[n].started or time.monotonic()
    each(live, one_host, parallel=16)


def copy_all(fan, states, files, pull_id, reporter):
    """Run the copies the schedule starts until every host has its files (or failed)."""
    for n in fan.needs:
        states[n].started = states[n].started or time.monotonic()
        if states[n].source_changed:
            fan.failed[n] = states[n].source_changed

    def run(copy):  # in a worker thread
        sender, host, key, offset = copy
        return _one_copy(states, sender, host, key, offset, files[key], pull_id)

    def ended(copy, answer):
        sender, host, key, offset = copy
        st = states[host]
        st.received += answer.get("bytes", 0)
        who = "here" if sender is SOURCE else sender
        st.by_sender[who] = st.by_sender.get(who, 0) + answer.get("bytes", 0)
        if answer.get("ok"):
            st.files_received += 1
            st.landed += files[key]["size"] - offset
            _progress(reporter, st, key, who, answer, files[key]["size"])
            fan.finished(sender, host, key, True)
            return
        fatal = answer["reason"] if answer.get("kind") in ("disk_full", "host", "source") else None
        if answer.get("kind") == "source":
            forget(files[key]["local"])
        reporter.line(host, f"{key[1]} from {who}: {answer.get('reason')}"
                            + ("" if fatal else "; trying again"))
        fan.finished(sender, host, key, False, fatal=fatal,
                     offset=0 if answer.get("kind") == "corrupt" else _part_after(offset, answer))

    flow(fan.next_copies, run, ended)
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
    reporter.line(st.name, f"{key[1]} ({mib(size)}) from {who} in {secs:.1f} s "
                           f"({answer.get('bytes', 0) / secs / 1e6:.0f} MB/s); "
                           f"{mib(landed)} of {mib(st.need)} at {rate / 1e6:.0f} MB/s{eta}")


def _one_copy(states, sender, host, key, offset, f, pull_id):
    """One file from `sender` (this machine or a host) into `host`. -> the receiver's answer."""
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
    return answer
