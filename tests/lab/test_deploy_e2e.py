"""The deploy core, end to end: the real `fab` against real OpenSSH hosts (the lab).

Issue bar: the DFlash profile's speculative config arrives intact; arbitrary text in args
and env arrives byte for byte with no shell evaluation; a failing server is reported within
two poll intervals with its log line; malformed profiles exit 2 leaving no trace on the host.

Here: the rest; the tests that need no host are in tests/unit/test_cli.py."""
import json
import subprocess
import sys
import time
from pathlib import Path
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hostlab import REPO
from tasks.profile.toml_text import dumps
from helpers import DRAFT, TARGET


CONFIGS = REPO / "configs"


RECORDER = Path(__file__).resolve().parents[1] / "servers" / "record_server.py"


@pytest.fixture(scope="module")
def hosts(lab):
    """The session lab's three hosts, each with Qwen3.6-27B's and z-lab's
    DFlash drafter's config.json."""
    for h in lab.hosts[:3]:
        for name, config in (("Qwen3.6-27B", TARGET), ("Qwen3.6-27B-DFlash", DRAFT)):
            d = lab.home(h) / "models" / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(config))
    return lab.hosts[:3]


def write_profile(lab, name, doc):
    path = lab.root / "profiles" / f"{name}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else dumps(doc))
    return path


def release_dir(lab, host, name, workdir="llmfab"):
    return (lab.home(host) / workdir / name / "current").resolve()


def test_dflash_profile_deploys_to_three_hosts_and_the_speculative_config_arrives_intact(lab, hosts):
    prof = write_profile(lab, "dflash3", "\n".join([
        f'extends = "{CONFIGS / "qwen3.6-27b-dflash.toml"}"',
        "[target]", f"hosts = {json.dumps(hosts)}", 'name = "dflash3"',
        "[server]", f'python = "{lab.ml_python}"', "port = 30951",
        "[ready]", "poll_interval = 0.2", "timeout = 60", ""]))
    r = lab.fab("deploy", profile=prof)
    assert r.returncode == 0, r.stdout + r.stderr
    for h in hosts:
        assert f"[{h}] ready in" in r.stdout
        got = json.loads((release_dir(lab, h, "dflash3") / "standin-received.json").read_text())
        assert got["args"]["speculative_config"] == {
            "method": "dflash", "model": "/root/models/Qwen3.6-27B-DFlash", "num_speculative_tokens": 15}
        assert got["args"]["tensor_parallel_size"] == 2
    st_ = lab.fab("status", "--json", profile=prof)
    assert st_.returncode == 0, st_.stdout + st_.stderr
    records = [json.loads(line) for line in st_.stdout.splitlines()]
    assert sorted(r_["host"] for r_ in records) == sorted(hosts)
    assert all(r_["running"] and r_["health"] == 200 and r_["served_name"] == "qwen3.6-27b" for r_ in records)
    assert lab.fab("stop", profile=prof).returncode == 0


# Text a shell would love to evaluate, plus anything hypothesis invents.
NASTY = ["$(touch {canary})", "`touch {canary}`", "; touch {canary}", "' \" \\ $HOME", "--leading-dash",
         "-x", "line\nbreak", "tab\tand\rcr", "ünïcødé ✓ 🚀", "{{\"json\": [1, 2]}}", "%s%n", "*", "~root"]


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=40)


def recorder_profile(lab, name, args, env, port):
    doc = {
        "target": {"hosts": ["h1"], "name": name},
        "server": {"engine": "command", "command": ["python3", "record_server.py"],
                   "files": [str(RECORDER)], "host": "127.0.0.1", "port": port,
                   "args": dict(args, port=port), "env": env},
        "ready": {"poll_interval": 0.2, "timeout": 30, "models_path": ""},
    }
    return write_profile(lab, name, doc)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(TEXT, min_size=1, max_size=12))
def test_args_and_env_arrive_byte_for_byte_and_no_shell_ever_runs(lab, hosts, values):
    canary = "/tmp/llmfab-canary"
    values = [v.format(canary=canary) if "{canary}" in v else v for v in NASTY] + values
    args = {f"a{i}": v for i, v in enumerate(values)}
    env = {f"LLMFAB_E{i}": v for i, v in enumerate(values)}
    prof = recorder_profile(lab, "argv-bytes", args, env, 30952)
    r = lab.fab("deploy", profile=prof)
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads((release_dir(lab, "h1", "argv-bytes") / "record.json").read_text())
    argv = [bytes.fromhex(a) for a in record["argv"]]
    expected = [b"record_server.py"]
    for k, v in args.items():
        expected += [f"--{k}".encode(), v.encode()]
    expected += [b"--port", b"30952"]
    assert argv[1:] == expected[1:]
    got_env = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["env"].items()}
    for k, v in env.items():
        assert got_env[k.encode()] == v.encode()
    assert not (lab.tmp("h1") / "llmfab-canary").exists()
    assert not Path(canary).exists()


def test_failing_server_is_reported_within_two_poll_intervals_with_its_line(lab, hosts):
    fatal_file = "/tmp/fatal-at"
    prof = write_profile(lab, "oom", "\n".join([
        f'extends = "{CONFIGS / "qwen3.6-27b.toml"}"',
        "[target]", 'hosts = ["h1"]', 'name = "oom"',
        "[server]", f'python = "{lab.ml_python}"', "port = 30953",
        "[server.env]", 'STANDIN_FAIL = "oom"', 'STANDIN_LOAD_SECONDS = "1.0"',
        f'STANDIN_FATAL_FILE = "{fatal_file}"',
        "[ready]", "poll_interval = 1.0", "timeout = 60", ""]))
    argv = [sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), "deploy", "--profile", str(prof)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "error: server failed" in line and "verdict" not in seen:
            seen["verdict"] = time.time()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 1, "".join(lines)
    out = "".join(lines)
    assert "torch.OutOfMemoryError: CUDA out of memory" in out
    fatal_at = float((lab.tmp("h1") / "fatal-at").read_text())
    assert seen["verdict"] - fatal_at <= 2 * 1.0, out


MALFORMED = [
    ("unknown key", "[server]\nengine='vllm'\nmodel='/m'\nflavour=1\n", "server.flavour"),
    ("port type", "[server]\nengine='vllm'\nmodel='/m'\nport='80a'\n", "server.port"),
    ("port range", "[server]\nengine='vllm'\nmodel='/m'\nport=80\n", "server.port"),
    ("no engine", "[server]\nmodel='/m'\n", "server.engine"),
    ("bad engine", "[server]\nengine='tgi'\nmodel='/m'\n", "server.engine"),
    ("no command", "[server]\nengine='command'\n", "server.command"),
    ("bad json", "[server]\nengine='vllm'\nmodel='/m'\n[server.args]\nspeculative-config='{method: 1}'\n",
     "server.args.speculative-config"),
    ("nested array", "[server]\nengine='vllm'\nmodel='/m'\n[server.args]\nx=[[1]]\n", "server.args.x"),
    ("array of tables", "[server]\nengine='vllm'\nmodel='/m'\n[server.args]\nx=[{a=1}]\n", "server.args.x"),
    ("nul byte", "[server]\nengine='vllm'\nmodel='/m'\n[server.args]\nx=\"a\\u0000b\"\n", "server.args.x"),
    ("unset secret", "[server]\nengine='vllm'\nmodel='/m'\n[server.env]\nT={from_env='LLMFAB_UNSET_X'}\n",
     "server.env.T"),
    ("escaping name", "[target]\nname='../x'\n[server]\nengine='vllm'\nmodel='/m'\n", "target.name"),
    ("workdir dotdot", "[target]\nworkdir='~/a/../../etc'\n[server]\nengine='vllm'\nmodel='/m'\n", "target.workdir"),
    ("toml syntax", "[server\nengine='vllm'\n", "line 4"),
    ("bool port", "[server]\nengine='vllm'\nmodel='/m'\nport=true\n", "server.port"),
]


@pytest.mark.parametrize("kind, body, key", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_profile_exits_2_naming_the_key_and_touches_no_host(lab, hosts, kind, body, key):
    prof = lab.root / "profiles" / f"bad-{kind.replace(' ', '-')}.toml"
    prof.parent.mkdir(exist_ok=True)
    head = "[target]\nhosts=['h1']\nworkdir='~/never-created'\n" if "[target]" not in body else ""
    text = head + body
    if "[target]" in body:
        text = text.replace("[target]\n", "[target]\nhosts=['h1']\n", 1)
    prof.write_text(text)
    before = lab.sshd_log("h1").count("Accepted publickey")
    r = lab.fab("deploy", profile=prof)
    assert r.returncode == 2, r.stdout + r.stderr
    assert key in r.stderr and str(prof) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (lab.home("h1") / "never-created").exists()
    assert lab.sshd_log("h1").count("Accepted publickey") == before
