"""[server] runtime = "podman" end to end: the stand-in vLLM in a rootful podman container on a
lab host (tests/podmanlab.py: the lab's Debian image, podman configured for this machine).

The container gets the stand-in's venv and the fake GPU driver's directory by [container]
mounts (with the host's /proc, so the stand-in registers its host pid, the one a real
nvidia-smi shows); the model directory and the deployment directory are mounted by llmfab.
Every wait is on a condition with a deadline.
"""
import functools
import json
import os
import signal
import time

import pytest

import helpers
from helpers import flat, write_profile
from hostlab import alive, wait_for
from podmanlab import missing, podman_lab

pytestmark = pytest.mark.e2e
HOST = "h1"  # shares this machine's PID namespace: the container's host pids are ours to see
SECRET = "s3cr3t-container-value-7731"
fab = functools.partial(helpers.fab, timeout=180)


@pytest.fixture(scope="module")
def pod():
    from conftest import require_lab
    require_lab()
    why = missing()
    if why:
        pytest.fail("the podman lab cannot run: " + why, pytrace=False)
    with podman_lab(1) as (lab, pod):
        yield lab, pod


def profile(lab, pod, name, port, env=(), supervise=(), extra=(), runtime="podman"):
    lines = ["[target]", f'hosts = ["{HOST}"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"', f'runtime = "{runtime}"',
             f'model = "{lab.model_dir("pod-model")}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"',
             "[server.env]", 'LAB_TOKEN = { from_env = "LLMFAB_POD_SECRET" }']
    env = dict({"STANDIN_GPU_MIB": "1024", "STANDIN_LOAD_SECONDS": "0.3"}, **dict(env))
    lines += [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[ready]", "timeout = 60", "poll_interval = 0.2"]
    if supervise:
        lines += ["[supervise]"] + [f"{k} = {json.dumps(v)}" for k, v in dict(supervise).items()]
    if runtime == "podman":
        lines += ["[container]", f'image = "{pod.image}"', 'gpus = "none"',
                  f'mounts = ["{lab.ml_env}:{lab.ml_env}:ro", "/tmp/fakegpu:/tmp/fakegpu", '
                  '"/proc:/tmp/fakegpu/hostproc:ro"]', *extra]
    return write_profile(lab, name, lines)


def run(lab, *args, **kw):
    return fab(lab, *args, env={"LLMFAB_POD_SECRET": SECRET}, **kw)


def status(lab, prof):
    r = lab.fab("status", "--json", profile=prof, timeout=60)
    return json.loads(r.stdout), r


def ddir(lab, name):
    return lab.home(HOST) / "llmfab" / name


def server(lab, name):
    return json.loads((ddir(lab, name) / "server.json").read_text())


def container_pids(lab, pod, name):
    """Host pids in the container, read independently of llmfab: `podman top` of its host pids."""
    r = pod.run(lab, HOST, "top", "llmfab-" + name, "hpid")
    return sorted(int(x) for x in r.stdout.split()[1:] if x.isdigit())


def inspect(lab, pod, name):
    r = pod.run(lab, HOST, "container", "inspect", "llmfab-" + name)
    return json.loads(r.stdout)[0] if r.returncode == 0 else None


def readable_by_root_only(path):
    """No one but root reads `path`: not by its own mode, nor through a directory above it."""
    if os.stat(path).st_mode & 0o077 == 0:
        return True
    parent = os.path.dirname(path)
    while parent != "/":
        if os.stat(parent).st_mode & 0o001 == 0 and os.stat(parent).st_uid == 0:
            return True
        parent = os.path.dirname(parent)
    return False


def all_argvs():
    """Every process's argv on this machine (the lab host shares its PID namespace): `ps`."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out.append(f.read())
        except OSError:
            continue
    return out


def test_deploy_status_bench_tail_log_and_stop_in_a_podman_container(pod):
    lab, pod = pod
    name = "pod-life"
    prof = profile(lab, pod, name, 31301)
    out = run(lab, "deploy", profile=prof)
    assert "ready in" in out.stdout and SECRET not in out.stdout + out.stderr
    rec = server(lab, name)
    assert rec["runtime"] == "podman" and rec["container"] == "llmfab-" + name
    info = inspect(lab, pod, name)
    assert info["State"]["Running"] and info["Config"]["Labels"]["llmfab.release"] == rec["release"]
    # the argv after the image is argv.json, byte for byte
    argv = json.loads((ddir(lab, name) / "current" / "argv.json").read_text())
    assert info["Config"]["Cmd"] == argv
    pids = container_pids(lab, pod, name)
    assert rec["pid"] in pids and rec["init_pid"] in pids
    # secrets: in the server's environment, never on any argv, never in a file others can read
    with open(f"/proc/{rec['pid']}/environ", "rb") as f:
        assert b"LAB_TOKEN=" + SECRET.encode() in f.read().split(b"\0")
    assert not any(SECRET.encode() in a for a in all_argvs())
    # llmfab's files, and the engine's copy of the container's environment (its storage)
    for top in (ddir(lab, name), pod.root):
        for root, _, files in os.walk(top):
            for f in files:
                p = os.path.join(root, f)
                if f == "standin-received.json" or not os.path.isfile(p) or os.path.islink(p):
                    continue  # the stand-in's own record of what it got (a test's, not llmfab's)
                with open(p, "rb") as fh:
                    if SECRET.encode() in fh.read():
                        assert readable_by_root_only(p), p
    assert not (ddir(lab, name) / "current" / "container.env").exists()

    st, r = status(lab, prof)
    assert r.returncode == 0, r.stderr
    assert st["runtime"] == "podman" and st["running"] and st["health"] == 200 and st["served_name"] == "m"
    assert st["container"]["name"] == "llmfab-" + name and st["container"]["status"] == "running"
    assert st["container"]["restarts"] == 0 and SECRET not in r.stdout + r.stderr
    human = run(lab, "status", profile=prof).stdout
    assert f"runtime podman: container llmfab-{name} running" in flat(human)
    # the stand-in's GPU memory is held by host pids of the container (what nvidia-smi shows)
    holders = {h["pid"] for h in st["gpu_holders"] if h["ours"]}
    assert holders and holders <= set(pids), (holders, pids)

    b = run(lab, "bench", "--json", "--requests", "4", profile=prof)
    assert json.loads(b.stdout)["errors"] == 0
    log = run(lab, "tail-log", "--lines", "50", profile=prof).stdout
    assert "Application startup complete." in log

    t0 = time.monotonic()
    stopped = run(lab, "stop", profile=prof)
    took = time.monotonic() - t0
    assert not any(alive(p) for p in pids)
    assert inspect(lab, pod, name)["State"]["Status"] == "exited"
    st, r = status(lab, prof)
    assert r.returncode == 1 and st["state"] == "stopped" and st["container"]["status"] == "exited"
    assert SECRET not in stopped.stdout + stopped.stderr
    print(f"fab stop of a podman container: {took:.2f} s")


def test_kill9_is_restarted_by_podman_after_the_old_processes_and_their_memory_are_gone(pod):
    lab, pod = pod
    name = "pod-kill"
    prof = profile(lab, pod, name, 31302, supervise={"restart": "on-failure", "max_restarts": 3})
    run(lab, "deploy", profile=prof)
    first = server(lab, name)
    old = container_pids(lab, pod, name)
    assert len(old) >= 3  # init, the server, its engine child
    os.kill(first["pid"], signal.SIGKILL)

    def restarted():
        st, r = status(lab, prof)
        return st if r.returncode == 0 and st["container"]["restarts"] == 1 else None
    st = wait_for(restarted, 60, "podman to restart the container and the server to be ready")
    assert st["pid"] != first["pid"] and st["running"] and st["health"] == 200
    # every process of the first attempt (the engine child holding GPU memory too) is gone,
    # and only the new attempt holds memory
    assert not any(alive(p) for p in old)
    holders = {h["pid"] for h in st["gpu_holders"] if h["ours"]}
    assert holders and not holders & set(old) and holders <= set(container_pids(lab, pod, name))
    gpu0 = next(g for g in st["gpus"] if g["index"] == 0)
    assert gpu0["used_mib"] == 4 + 1024  # the stand-in driver's baseline plus one attempt's
    log = (ddir(lab, name) / "current" / "server.log").read_text()
    assert "--- llmfab: restart of the server by the container engine ---" in log
    assert log.count("Application startup complete.") == 2
    run(lab, "stop", profile=prof)


def test_stop_of_a_server_and_child_that_ignore_sigterm_ends_after_the_grace(pod):
    lab, pod = pod
    name = "pod-term"
    prof = profile(lab, pod, name, 31303, env={"STANDIN_IGNORE_TERM": "1"})
    run(lab, "deploy", profile=prof)
    pids = container_pids(lab, pod, name)
    t0 = time.monotonic()
    out = run(lab, "stop", "--grace", "2", profile=prof)
    took = time.monotonic() - t0
    assert not any(alive(p) for p in pids)
    assert inspect(lab, pod, name)["State"]["ExitCode"] == 137
    assert 2 <= took < 20, took
    print(out.stdout)
    assert "SIGKILL" in out.stdout or "killed" in out.stdout, out.stdout


def test_a_failed_start_is_explained_and_rollback_runs_the_previous_release_in_its_container(pod):
    lab, pod = pod
    name = "pod-roll"
    good = profile(lab, pod, name, 31304)
    run(lab, "deploy", profile=good)
    first = server(lab, name)["release"]
    bad = profile(lab, pod, name, 31304, env={"STANDIN_FAIL": "oom"})
    out = fab(lab, "deploy", "--no-restore", profile=bad, code=1, env={"LLMFAB_POD_SECRET": SECRET})
    print(out.stdout)
    assert "CUDA out of memory" in out.stdout and "fix" in out.stdout, out.stdout
    st, r = status(lab, bad)
    assert st["state"] == "failed" and st["container"]["status"] == "exited"
    run(lab, "rollback", "--release", first, profile=good)
    st, r = status(lab, good)
    assert r.returncode == 0 and st["release"] == first and st["container"]["status"] == "running"
    assert inspect(lab, pod, name)["Config"]["Labels"]["llmfab.release"] == first
    run(lab, "stop", profile=good)


def test_a_hung_server_reads_unhealthy_and_still_stops(pod):
    lab, pod = pod
    name = "pod-hang"
    prof = profile(lab, pod, name, 31305, env={"STANDIN_HANG": "http", "STANDIN_HANG_AFTER": "0.5"})
    run(lab, "deploy", profile=prof)

    def unhealthy():
        st, r = status(lab, prof)
        return st if r.returncode == 1 and st["running"] and st["health"] != 200 else None
    st = wait_for(unhealthy, 30, "status to see the hang")
    assert st["container"]["status"] == "running"
    pids = container_pids(lab, pod, name)
    run(lab, "stop", "--grace", "2", profile=prof)
    assert not any(alive(p) for p in pids)


def test_check_fails_naming_a_missing_image_and_how_to_get_it(pod):
    lab, pod = pod
    prof = profile(lab, pod, "pod-noimage", 31306)
    text = prof.read_text().replace(pod.image, "localhost/no-such-image")
    prof.write_text(text)
    out = fab(lab, "check", profile=prof, code=1, env={"LLMFAB_POD_SECRET": SECRET})
    said = flat(out.stdout + out.stderr)
    assert "image localhost/no-such-image is not on this host" in said
    assert "podman pull localhost/no-such-image" in said


def test_kill_gpu_procs_ends_a_container_through_its_engine_so_it_is_not_restarted(pod):
    lab, pod = pod
    name = "pod-gpukill"
    prof = profile(lab, pod, name, 31307, supervise={"restart": "always"})
    run(lab, "deploy", profile=prof)
    pids = container_pids(lab, pod, name)
    out = run(lab, "kill-gpu-procs", "--grace", "2", profile=prof)
    print(out.stdout)
    assert not any(alive(p) for p in pids)
    info = inspect(lab, pod, name)
    # after a signal of ours the server's end would be podman's to answer: restart "always"
    assert info["State"]["Status"] == "exited" and info["RestartCount"] == 0
    st, r = status(lab, prof)
    assert r.returncode == 1 and not st["running"]


def test_a_hung_server_is_killed_by_the_hang_watch_and_restarted_by_podman(pod):
    """[supervise] hang_timeout in a container: SIGSTOP of the server (podman sees it running)
    is seen by the hang watch beside the container, which SIGKILLs the container; podman's
    restart policy starts it again, ready, and server.log says why. A stop ends the watch."""
    lab, pod = pod
    name = "pod-hang-restart"
    prof = profile(lab, pod, name, 31308, supervise={"restart": "on-failure", "hang_timeout": 3})
    run(lab, "deploy", profile=prof)
    try:
        first = server(lab, name)["pid"]
        stopped_at = time.monotonic()
        os.kill(first, signal.SIGSTOP)

        def again():
            st, r = status(lab, prof)
            return st if r.returncode == 0 and st["health"] == 200 and st["pid"] != first else None
        st = wait_for(again, 60, "the hung server restarted by podman")
        assert st["container"]["restarts"] >= 1, st
        assert time.monotonic() - stopped_at < 3 + 5 + 30
        log = (lab.home(HOST) / "llmfab" / name / "current" / "server.log").read_text()
        assert "llmfab: hung: no /health 200 for" in log and "SIGKILL to container" in log, log[-2000:]
        assert "--- llmfab: restart of the server by the container engine ---" in log
    finally:
        run(lab, "stop", profile=prof)
    wait_for(lambda: not watchers(name), 20, "the hang watch to end")


def watchers(name):
    """Pids of hang watches (`python -S -m llmfab_host.runtime.host.container watch RELEASE`) of
    deployment `name`."""
    out = []
    for d in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"llmfab_host.runtime.host.container" in argv and any(f"/{name}/releases/".encode() in a for a in argv):
            out.append(int(d))
    return out
