"""`fab pull`'s progress line (tasks/weights/copies.py `_progress`): the bytes it counts never
pass what the host needs (a retried copy's bytes count once), and no time left is guessed
from the first instant of the copy (a first tiny file said "~4138111 s left")."""
import io
import re
import time

from tasks.output import Reporter
from tasks.weights.copies import _progress
from tasks.weights.pull import _HostState


class _Named:
    name = "h1"


def _line(st, size, answer):
    out = io.StringIO()
    _progress(Reporter(["h1"], stream=out), st, ("/m", "w.bin"), "here", answer, size)
    return out.getvalue()


def test_a_retried_copy_never_counts_past_what_the_host_needs():
    st = _HostState(_Named())
    st.need, st.started = 100 << 10, time.monotonic() - 5
    st.received = 200 << 10   # the bytes of a failed copy, then its retry
    st.landed = 100 << 10     # one file of 100 KiB verified
    text = _line(st, 100 << 10, {"ok": True, "bytes": 100 << 10, "seconds": 0.5})
    done, need = re.search(r"; ([0-9.]+) MiB of ([0-9.]+) MiB", text).groups()
    assert float(done) <= float(need), text
    assert "left" not in text, text  # nothing is left


def test_no_time_left_is_guessed_from_the_first_instant():
    st = _HostState(_Named())
    st.need, st.started = 4 << 30, time.monotonic() - 0.1
    st.received = st.landed = 120  # a config.json, in the first tenth of a second
    text = _line(st, 120, {"ok": True, "bytes": 120, "seconds": 0.05})
    assert "left" not in text, text
