"""What reaches a terminal (tasks/output.py): a server's control characters escaped, long lines
cut, JSON escaping what JSON leaves raw; our own colours only without NO_COLOR, our cursor
control only without TERM=dumb. The terminal is a real pseudo-terminal (os.openpty)."""
import json
import os
import threading

import pytest

from tasks.output import Block, Reporter, json_text, terminal_text

HOSTILE = ("t \x1b]0;TITLE\x07 c \x1b]52;c;eA==\x07 l \x1b]8;;http://x/\x1b\\k\x1b]8;;\x1b\\ "
           "s \x1b[31mR\x1b[0m cr a\rb nul \x00 del \x7f c1 \x9b31m bidi \u202e ls \u2028 end")


def test_every_control_character_is_escaped_and_printable_text_is_kept():
    shown = terminal_text(HOSTILE)
    assert shown == ("t \\x1b]0;TITLE\\x07 c \\x1b]52;c;eA==\\x07 l \\x1b]8;;http://x/\\x1b\\k"
                     "\\x1b]8;;\\x1b\\ s \\x1b[31mR\\x1b[0m cr a\\x0db nul \\x00 del \\x7f c1 \\x9b31m "
                     "bidi \\u202e ls \\u2028 end")
    assert terminal_text("tab\tkept é 模型 ✓") == "tab\tkept é 模型 ✓"


def test_a_long_line_is_cut_saying_how_much():
    shown = terminal_text("A" * 200000)
    assert shown.startswith("A" * 4096 + " [... 195904 more characters cut")
    assert len(shown) < 4300


def test_json_escapes_what_json_dumps_leaves_raw_and_reads_back_the_same():
    text = json_text({"id": HOSTILE})
    assert not any(c in text for c in "\x1b\x07\r\x00\x7f\x9b\u2028")
    assert json.loads(text) == {"id": HOSTILE}


def reporter_on_a_pty(monkeypatch, env, emit):
    """What a Reporter writes to a real terminal with `env` set: the bytes the pty reads."""
    for key in ("NO_COLOR", "TERM"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    master, slave = os.openpty()
    got = bytearray()

    def read():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            got.extend(data)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    with os.fdopen(slave, "w", closefd=True) as stream:
        emit(Reporter(["h1"], stream=stream))
    t.join(5)
    os.close(master)
    return got.decode("utf-8", "replace")


def emit_all(rep):
    rep.progress("h1", "loading", "loading 1.0s")
    rep.line("h1", "fatal", color="31")
    rep.line("h1", HOSTILE)
    rep.line("h1", Block("error: server failed: " + HOSTILE, (("fix", "remove --\x1b]0;x\x07"),)))


@pytest.mark.parametrize("env,color,cursor", [
    ({"TERM": "xterm"}, True, True),
    ({"TERM": "xterm", "NO_COLOR": "1"}, False, True),
    ({"TERM": "xterm", "NO_COLOR": ""}, True, True),  # no-color.org: set AND not empty
    ({"TERM": "dumb"}, False, False),
])
def test_our_colours_follow_no_color_and_our_cursor_control_term_dumb(monkeypatch, env, color, cursor):
    out = reporter_on_a_pty(monkeypatch, env, emit_all)
    assert ("\x1b[31mfatal\x1b[0m" in out) is color, repr(out)
    assert ("\x1b[2K" in out) is cursor, repr(out)
    # whatever the terminal, a server's text arrives escaped: the only ESC are our own
    left = out.replace("\x1b[31m", "").replace("\x1b[0m", "").replace("\x1b[2K", "")
    assert not any(c in left for c in "\x1b\x07\x00\x9b\u202e"), repr(left)
    assert "\\x1b]0;TITLE\\x07" in out and "remove --\\x1b]0;x\\x07" in out


def test_a_raw_line_is_written_as_it_is():
    import io
    stream = io.StringIO()
    Reporter(["h1"], stream=stream).line("", HOSTILE, raw=True)
    assert stream.getvalue() == HOSTILE + "\n"


# Writers to the terminal outside tasks/output.py, each writing only llmfab's own constant words
# or a document it made itself (never a server's text): the interrupt notes, `--version`, and
# `fab targets`' file_sd document (JSON, from the profile).
OWN_WORDS = {"tasks/interrupts.py": 2, "tasks/fleet/rolling.py": 1, "tasks/program.py": 1,
             "tasks/targets.py": 1}


def test_nothing_writes_to_the_terminal_around_the_output_layer():
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    found = {}
    for path in sorted((root / "tasks").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        # host code runs on the host (its stdout is the agent's channel); docsgen writes files;
        # the launcher is a template run on the host
        if "/host/" in rel or rel in ("tasks/output.py", "tasks/docsgen.py", "tasks/release/launcher.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            text = ast.unparse(f)
            if text == "print" or text in ("sys.stdout.write", "sys.stderr.write", "os.write") \
                    and not (text == "os.write" and "fileno" not in ast.unparse(node.args[0])):
                found[rel] = found.get(rel, 0) + 1
    assert found == OWN_WORDS, "write human text through tasks/output.py (Reporter, write_text)"
