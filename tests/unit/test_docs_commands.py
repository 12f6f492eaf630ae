"""Every `fab` command README.md and docs/*.md show, run against the demo, prints what the page
shows.

The pages' commands are read from the pages themselves: the `$ fab ...` lines of their code
blocks (with the output lines under them) and the `fab ...` of inline code. A command runs
here when it needs nothing this machine lacks: no `-H` host, no placeholder (FILE, N, DIR,
A.json, `<stem>`, `[...]`), no profile file that does not exist, not a task that never ends
(`--follow`), pulls weights or kills processes. What is left runs as the installed `llmfab`
(the same tasks as `fab`) in a scratch directory holding a copy of configs/demo.toml on a free
port, with HOME there too (the demo's workdir is `~/llmfab`): nothing of the machine's own
demo is touched. The demo is deployed first and stopped last.

Comparison, tolerant of what differs run to run and of abridged output: each output line the
page shows, with its numbers masked (`#`: timings, pids, ports, release stamps) and its
whitespace collapsed, must appear in what the command printed, read the same way (so a line
wrapped to the terminal still matches); lines the page leaves out are allowed ("abridged").
Every command must exit 0 (`fab status`, `check`... on the running demo), print no traceback,
and never be refused as bad input (exit 2: the page shows a command that does not parse).
About 40 s on a 2-core machine: the demo's 2 s load and a few dozen short commands.
"""
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
PLACEHOLDER = re.compile(r"\b(FILE|N|DIR|TASK|KEY|MS|NAME|P)\b|<|\[|\.\.\.|A\.json|/etc/")
NEVER = ("--follow", "pull", "rollback", "sleep", "wake")  # sleep/wake: an endpoint profile, not the demo
NEVER_EXACT = {"fab kill-gpu-procs"}  # only its --dry-run runs here
NAMED_ONLY = ("tune",)  # inline `fab tune` names the task; its commands are in code blocks


def _mask(text):
    return " ".join(re.sub(r"\d+(?:\.\d+)?", "#", text).split())


def page_commands():
    """[(page, line number, argv after `fab`, [shown output lines])]."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^ {4}(?:\$ )?(fab .*?)\s*(?:#.*)?$", line)
            if m and not m.group(1).endswith("\\"):
                shown = []
                for nxt in lines[i + 1:]:
                    if not nxt.startswith("    ") or nxt.lstrip().startswith("$ "):
                        break
                    shown.append(nxt[4:].split("   #")[0].rstrip())
                out.append((page.name, i + 1, m.group(1), shown if line.lstrip().startswith("$") else []))
            for inline in re.findall(r"`(fab [^`]+)`", line):
                if not any(w in NAMED_ONLY for w in inline.split()):
                    out.append((page.name, i + 1, inline, []))
    return out


def runnable(cmd):
    if PLACEHOLDER.search(cmd) or cmd in NEVER_EXACT or " -H" in cmd or " -S" in cmd or " -t " in cmd:
        return False
    words = shlex.split(cmd)
    if any(w in NEVER for w in words[1:]):
        return False
    if "--profile" in words:
        given = words[words.index("--profile") + 1]
        if not (ROOT / given).is_file() or "--dry-run" not in words:  # a GPU profile: only a dry run
            return False
    return True


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A scratch directory with the demo profile on a free port; `run(cmd)` runs a page's
    `fab ...` there as `llmfab ...`, returning (exit code, output)."""
    home = tmp_path_factory.mktemp("docs-demo")
    (home / "configs").mkdir()
    port = free_port()
    text = (ROOT / "configs" / "demo.toml").read_text().replace("18000", str(port))
    (home / "configs" / "demo.toml").write_text(text)
    shutil.copy(ROOT / "configs" / "demo_server.py", home / "configs" / "demo_server.py")
    for cfg in ROOT.glob("configs/*.toml"):  # the GPU profiles, for their dry runs
        if cfg.name != "demo.toml":
            shutil.copy(cfg, home / "configs" / cfg.name)
    env = dict(os.environ, HOME=str(home), COLUMNS="200", XDG_STATE_HOME=str(home / "state"))
    env.pop("NO_COLOR", None)

    def run(cmd):
        words = shlex.split(cmd)[1:]
        r = subprocess.run([sys.executable, "-c", "from tasks.program import main; main()", *words],
                           cwd=str(home), env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True,
                           text=True, timeout=120)
        out = (r.stdout + r.stderr).replace(str(home), "/root")
        return r.returncode, out
    state = {"deployed": False}

    def run_deployed(cmd):
        """`cmd`, once the demo runs (the page's own `fab deploy` deploys it, first)."""
        if not state["deployed"] and cmd != "fab deploy":
            code, out = run("fab deploy")
            assert code == 0, out
        state["deployed"] = True
        return run(cmd)
    yield run_deployed
    code, out = run("fab stop")
    assert code == 0 and "stopped release" in out, out


def commands():
    """The runnable commands, each once (with every page line that shows it and every output
    line shown under it), `fab deploy` first; `fab stop` runs once, last (the fixture)."""
    merged = {}
    for page, line, cmd, shown in page_commands():
        if runnable(cmd) and shlex.split(cmd)[1:2] != ["stop"]:
            where, lines = merged.setdefault(cmd, ([], []))
            where.append(f"{page}:{line}")
            lines.extend(shown)
    return sorted(((", ".join(w), cmd, shown) for cmd, (w, shown) in merged.items()),
                  key=lambda c: c[1] != "fab deploy")


COMMANDS = commands()


def test_the_pages_show_commands_that_run_here():
    # the test must not quietly run nothing: the tour's commands are among these
    shown = {c[1] for c in COMMANDS}
    assert {"fab deploy", "fab status", "fab bench --requests 8"} <= shown, shown


@pytest.mark.parametrize("where,cmd,shown", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_a_pages_command_prints_what_the_page_shows(demo, where, cmd, shown):
    code, out = demo(cmd)
    assert "Traceback" not in out, f"{where}: `{cmd}`\n{out}"
    assert code == 0, f"{where}: `{cmd}` exited {code}\n{out}"
    printed = _mask(out)
    for want in shown:
        assert _mask(want) in printed, f"{where}: `{cmd}` did not print\n  {want}\n--- it printed\n{out}"
