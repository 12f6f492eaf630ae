"""A server's text never reaches the terminal raw: the real `fab` against a lab host running
tests/servers/hostile_server.py, whose log lines, /v1/models ids and argparse error hold
escape sequences (window title, OSC 52 clipboard, hyperlink, colour), a CR, a NUL, a C1 CSI,
a bidirectional override and a 200,000-byte line.

Every human line (deploy's failure explanation and its cause and fix, status, tail-log) shows
them escaped and cuts the long line; --json carries them as JSON escapes; `tail-log --raw`
gives the bytes back; and the failing server's last line, written without a newline, is the
one that explains it.
"""
import json
from pathlib import Path

from helpers import fab, write_profile

HOSTILE = Path(__file__).resolve().parents[1] / "servers" / "hostile_server.py"
# what must never reach a terminal from a server: ESC, BEL, CR, NUL, C1 CSI, RLO
RAW = ("\x1b", "\x07", "\r", "\x00", "\x9b", "\u202e")
LONGEST_HUMAN_LINE = 4096 + 200   # tasks/output.py MAX_LINE_CHARS, plus the prefix and the note


def profile(lab, name, port, *argv):
    return write_profile(lab, name, [
        "[target]", 'hosts = ["h3"]', f'name = "{name}"',
        "[server]", 'engine = "command"',
        'command = ["python3", "hostile_server.py"' + "".join(f', "{a}"' for a in argv) + "]",
        f'files = ["{HOSTILE}"]', 'host = "127.0.0.1"', f"port = {port}",
        "[server.args]", f"port = {port}", "[ready]", 'models_path = "/v1/models"', "timeout = 60",
        "poll_interval = 0.2"])


def assert_safe(text, what):
    for c in RAW:
        assert c not in text, f"{what} holds {c!r} raw:\n{text[:3000]!r}"
    longest = max((len(line) for line in text.split("\n")), default=0)
    assert longest <= LONGEST_HUMAN_LINE, f"{what} has a line of {longest} characters"


def test_a_failing_servers_text_is_escaped_and_its_last_line_without_a_newline_explains_it(lab):
    prof = profile(lab, "hostile-die", 31861, "--die")
    r = fab(lab, "deploy", profile=prof, code=1)
    assert_safe(r.stdout + r.stderr, "deploy's human output")
    # the last line (no newline) is read: argparse's error is the explanation, its flag escaped
    assert "error: server failed: the engine does not know --\\x1b]0;PWNED-FLAG\\x07flag" in r.stdout, r.stdout
    assert "hostile: title \\x1b]0;PWNED-TITLE\\x07 end" in r.stdout  # the log lines under it
    assert "[... " in r.stdout and "more characters cut" in r.stdout  # the 200,000-byte line
    j = fab(lab, "deploy", "--json", profile=prof, code=1)
    assert "\x1b" not in j.stdout and "\x9b" not in j.stdout  # JSON escapes them
    fatal = json.loads(j.stdout.splitlines()[0])["fatal"]
    assert fatal["rule"] == "unrecognized-arguments", fatal
    assert fatal["line"].endswith("--\x1b]0;PWNED-FLAG\x07flag")  # the bytes, unescaped by JSON
    assert_safe(j.stderr, "deploy --json's human text")
    st = fab(lab, "status", profile=prof, code=1)
    assert_safe(st.stdout + st.stderr, "status of the failed release")
    assert "--\\x1b]0;PWNED-FLAG\\x07flag" in st.stdout, st.stdout


def test_a_running_servers_model_ids_and_log_are_escaped_and_raw_gives_them_back(lab):
    prof = profile(lab, "hostile-run", 31862)
    try:
        r = fab(lab, "deploy", profile=prof)
        assert_safe(r.stdout + r.stderr, "deploy's output")
        st = fab(lab, "status", profile=prof)
        assert_safe(st.stdout + st.stderr, "status")
        assert "model model\\x1b]0;PWNED-MODEL\\x07-id" in st.stdout, st.stdout
        sj = fab(lab, "status", "--json", profile=prof)
        assert "\x1b" not in sj.stdout
        assert json.loads(sj.stdout.splitlines()[0])["served_name"] == "model\x1b]0;PWNED-MODEL\x07-id"

        t = fab(lab, "tail-log", profile=prof)
        assert_safe(t.stdout + t.stderr, "tail-log")
        shown = t.stdout.splitlines()
        assert "hostile: carriage safe\\x0dEVIL-OVERWRITE" in shown
        assert "hostile: nul a\\x00b end" in shown and "hostile: c1 \\x9b31m end" in shown
        assert "hostile: bidi \\u202eevil\\u202c end" in shown
        assert "hostile: link \\x1b]8;;http://evil.invalid/\\x1b\\click\\x1b]8;;\\x1b\\ end" in shown
        long = next(line for line in shown if line.startswith("hostile: long "))
        assert long.startswith("hostile: long " + "A" * 4000) and "more characters cut" in long

        raw = fab(lab, "tail-log", "--raw", profile=prof)
        lines = raw.stdout.split("\n")
        assert "hostile: title \x1b]0;PWNED-TITLE\x07 end" in lines
        assert "hostile: long " + "A" * 200000 in lines
        assert "\\x" not in raw.stdout  # nothing escaped (a CR reads as a newline through `text=True`)
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)
