"""End to end: two deployments on one box, sharing its (fake) GPUs, over real SSH.

Each deployment must know exactly what is its own: the stand-in vLLM's engine child renames
itself and wipes its environment as setproctitle does (tests/standins/engine.py wipe_environ),
so the environment marker alone finds nothing, as on the real engine. Identity comes from the
release's cgroup (the lab host can write /sys/fs/cgroup), or, with LLMFAB_NO_CGROUP, from the
release's session.
"""
import functools
import json
import os
import signal

import pytest

import helpers
from helpers import write_profile
from hostlab import HostLab, alive, wait_for

pytestmark = pytest.mark.e2e

MIB = 2048
BASELINE = 4
HOST = "h1"


@pytest.fixture(scope="module")
def lab():
    with HostLab(1) as lab:
        yield lab


def profile(lab, name, port, args=(), **env):
    lines = ["[target]", f'hosts = ["{HOST}"]', f'name = "{name}"', "[server]", 'engine = "vllm"',
             f'python = "{lab.ml_python}"', f'model = "{lab.model_dir("m")}"', f"port = {port}",
             "[server.args]", f'served-model-name = "{name}"', "tensor-parallel-size = 2", *args,
             "[server.env]", f'STANDIN_GPU_MIB = "{MIB}"']
    lines += [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[ready]", "timeout = 60", "poll_interval = 0.2"]
    return write_profile(lab, name, lines)


fab = functools.partial(helpers.fab, timeout=180)


def status(lab, prof, code=0):
    r = fab(lab, "status", "--json", profile=prof, code=code)
    return json.loads(r.stdout), r


def server_of(lab, name):
    return json.loads((lab.home(HOST) / "llmfab" / name / "server.json").read_text())


def gpu_pids(lab):
    r = lab.exec(HOST, ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                 capture_output=True, text=True, check=True)
    return sorted({int(p) for p in r.stdout.split()})


def flat(text):
    """The words of fab's output without the [host] prefixes and the wrapping."""
    return " ".join(" ".join(line.split("] ", 1)[-1] if line.startswith("[") else line
                             for line in text.splitlines()).split())


def environ_has_marker(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return b"LLMFAB_RELEASE=" in f.read()


def test_two_deployments_on_one_gpu_each_knows_its_own(lab):
    a, b = profile(lab, "alpha", 8201), profile(lab, "beta", 8202)
    fab(lab, "deploy", profile=a)
    fab(lab, "deploy", profile=b)
    sa, sb = server_of(lab, "alpha"), server_of(lab, "beta")
    assert sa["identity"] == sb["identity"] == "cgroup" and sa["name"] == "alpha"
    cg = f"/sys/fs/cgroup/unified{sa['cgroup']}/cgroup.procs"
    members = {int(x) for x in open(cg).read().split()}
    assert sa["pid"] in members and sa["pgid"] in members
    engines = [p for p in gpu_pids(lab) if p not in (sa["pid"], sb["pid"])]
    assert len(engines) == 2 and not any(environ_has_marker(p) for p in engines)  # as setproctitle leaves them

    st, _ = status(lab, a)
    assert st["identity"] == "cgroup"
    mine = {h["pid"] for h in st["gpu_holders"] if h["ours"]}
    theirs = [h for h in st["gpu_holders"] if not h["ours"]]
    assert sa["pid"] in mine and len(mine) == 2
    assert {h["deployment"] for h in theirs} == {"beta"} and {h["release"] for h in theirs} == {sb["release"]}
    text = flat(lab.fab("status", profile=a, timeout=60).stdout)
    assert f"another deployment beta, release {sb['release']}" in text

    check = lab.fab("check", profile=a, timeout=120)
    assert "GPU 0 is shared with another deployment: beta" in flat(check.stdout + check.stderr)

    # stop one: exit 0 in seconds, though the other still holds memory on both GPUs
    r = fab(lab, "stop", profile=a)
    assert "GPU memory of this deployment freed" in r.stdout, r.stdout
    assert f"another deployment beta, release {sb['release']}" in flat(r.stdout)
    assert status(lab, b)[0]["health"] == 200
    assert not alive(sa["pid"])
    fab(lab, "stop", profile=b)


def test_an_orphan_is_named_refused_and_freed_without_touching_the_neighbour(lab):
    a, b = profile(lab, "gamma", 8203), profile(lab, "delta", 8204)
    fab(lab, "deploy", profile=a)
    fab(lab, "deploy", profile=b)
    sa, sb = server_of(lab, "gamma"), server_of(lab, "delta")
    before = set(gpu_pids(lab))
    os.kill(sb["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(sb["pid"]), 10, "delta's server to die")
    orphan = [p for p in gpu_pids(lab) if p in before and p not in (sa["pid"], sb["pid"])
              and p not in {h["pid"] for h in status(lab, a)[0]["gpu_holders"] if h["ours"]}]
    assert len(orphan) == 1
    orphan = orphan[0]

    st, r = status(lab, b, code=1)
    ours = [h for h in st["gpu_holders"] if h["ours"]]
    assert {h["pid"] for h in ours} == {orphan}
    text = flat(lab.fab("status", profile=b, timeout=60).stdout)
    assert f"pid {orphan} (VLLM::EngineCore) of release {sb['release']}" in text
    assert "with no server running" in text and "fab kill-gpu-procs --profile" in text
    assert "another deployment gamma" in text

    redeploy = lab.fab("deploy", profile=b, timeout=180)
    assert redeploy.returncode == 1 and f"pid {orphan} (VLLM::EngineCore)" in flat(redeploy.stdout + redeploy.stderr)

    dry = fab(lab, "kill-gpu-procs", "--dry-run", "--json", profile=b)
    plan = json.loads(dry.stdout)
    spared = {p["pid"]: p["spared"] for p in plan["processes"]}
    assert spared[sa["pid"]] == f"another deployment gamma, release {sa['release']}"
    assert spared[orphan] is None
    assert "left alone: another deployment gamma" in flat(dry.stderr)

    fab(lab, "kill-gpu-procs", "--grace", "2", profile=b)
    wait_for(lambda: not alive(orphan), 20, "the orphan to be killed")
    assert alive(sa["pid"]) and status(lab, a)[0]["health"] == 200
    fab(lab, "stop", profile=a)
    fab(lab, "stop", profile=b)


def test_preflight_fails_an_engine_ask_above_what_is_free(lab):
    a = profile(lab, "epsilon", 8205)
    fab(lab, "deploy", profile=a)
    greedy = profile(lab, "zeta", 8206, args=["gpu-memory-utilization = 0.99"])
    r = lab.fab("check", profile=greedy, timeout=120)
    out = flat(r.stdout + r.stderr)
    assert r.returncode == 1, out
    free = 81559 - BASELINE - MIB
    assert f"gpu-memory-utilization 0.99 x 81559 MiB = {int(0.99 * 81559)} MiB" in out, out
    assert f"only {free} MiB is free" in out and "at most 0.95" in out
    fab(lab, "stop", profile=a)


def test_session_identity_where_no_cgroup_is_made(lab):
    prof = profile(lab, "eta", 8207, LLMFAB_NO_CGROUP="1")
    fab(lab, "deploy", profile=prof)
    server = server_of(lab, "eta")
    assert server["identity"] == "session" and server["cgroup"] is None
    st, _ = status(lab, prof)
    assert st["identity"] == "session"
    engine = sorted({h["pid"] for h in st["gpu_holders"] if h["ours"] and h["pid"] != server["pid"]})
    assert len(engine) == 1 and not environ_has_marker(engine[0])
    os.kill(server["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(server["pid"]), 10, "the server to die")
    st, _ = status(lab, prof, code=1)
    assert sorted({h["pid"] for h in st["gpu_holders"] if h["ours"]}) == engine
    r = fab(lab, "stop", profile=prof)
    assert not alive(engine[0]), r.stdout
