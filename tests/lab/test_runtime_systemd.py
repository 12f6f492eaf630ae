"""runtime = "systemd" end to end (issue 40): a lab host whose PID 1 is systemd 252.

h1 is the lab's Debian rootfs booted by systemd-nspawn with sshd inside (tests/systemdhost.py);
fab reaches it over SSH like any host. The stand-in vLLM plays the server. Every wait is on a
condition with a deadline; the container's pids are read and signalled inside it.
"""
import functools
import json
import re
import stat
import time

import pytest

import helpers
from helpers import flat, write_profile
from hostlab import HostLab, wait_for

HOST = "h1"
SECRET = "s3cr3t-Value-%n-$HOME"
ODD = 'a "q" $HOME ${X} %n %% \\ `x` \'s\''  # what ExecStart / EnvironmentFile quoting must keep


@pytest.fixture(scope="module")
def lab():
    with HostLab(1, systemd=(1,)) as lab:
        yield lab


fab = functools.partial(helpers.fab, timeout=180)


def profile(lab, name, port, env=(), supervise=(), enable=True, runtime="systemd", timeout=60):
    lines = ["[target]", f'hosts = ["{HOST}"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'runtime = "{runtime}"', f'python = "{lab.ml_python}"',
             f'model = "{lab.model_dir("sd-model")}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"',
             "[server.env]", 'TOKEN = { from_env = "SD_TOKEN" }']
    env = dict({"STANDIN_GPU_MIB": "1024", "STANDIN_LOAD_SECONDS": "0.3"}, **dict(env))
    lines += [f"{k} = {json.dumps(v)}" for k, v in env.items()]
    lines += ["[ready]", f"timeout = {timeout}", "poll_interval = 0.2"]
    if supervise:
        lines += ["[supervise]"] + [f"{k} = {json.dumps(v)}" for k, v in dict(supervise).items()]
    if runtime == "systemd":
        lines += ["[systemd]", f"enable = {json.dumps(enable)}"]
    return write_profile(lab, name, lines)


def run(lab, *args, profile, code=0, timeout=180):
    r = lab.fab(*args, profile=profile, env={"SD_TOKEN": SECRET}, timeout=timeout)
    assert r.returncode == code, (args, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    assert SECRET not in r.stdout + r.stderr
    return r


def status(lab, prof):
    r = lab.fab("status", "--json", profile=prof, env={"SD_TOKEN": SECRET}, timeout=60)
    return json.loads(r.stdout), r


def inside(lab, *argv):
    return lab.systemd(HOST).exec(list(argv), timeout=60)


def deploy_dir(lab, name):
    return lab.home(HOST) / "llmfab" / name


def current(lab, name):
    return (deploy_dir(lab, name) / "current").resolve()


def server_json(lab, name):
    return json.loads((deploy_dir(lab, name) / "server.json").read_text())


def test_deploy_status_bench_tail_log_under_one_unit_and_no_secret_anywhere(lab):
    name = "sd-life"
    prof = profile(lab, name, 31201, {"ODD": ODD}, {"restart": "on-failure", "backoff": 1})
    run(lab, "deploy", profile=prof)
    st, r = status(lab, prof)
    assert r.returncode == 0 and st["running"] and st["health"] == 200
    assert st["runtime"] == "systemd"
    unit = st["unit"]
    assert unit["name"] == "llmfab-sd-life.service" and unit["ActiveState"] == "active"
    assert unit["NRestarts"] == 0 and unit["UnitFileState"] == "enabled"
    # the unit's main process IS the server: the pid systemd knows is the one status names
    main = inside(lab, "systemctl", "show", "-p", "MainPID", "--value", unit["name"]).stdout.strip()
    assert int(main) == st["pid"] == server_json(lab, name)["pid"]
    human = flat(run(lab, "status", profile=prof).stdout)
    assert ("runtime systemd: unit llmfab-sd-life.service active (running), 0 restarts by systemd, "
            "enabled at boot") in human
    # argv exactly as the release's argv.json, the odd value and the secret exactly as given
    rel = current(lab, name)
    got = json.loads((rel / "standin-received.json").read_text())
    argv = json.loads((rel / "argv.json").read_text())
    assert argv[1] == "-m" and got["argv"][1:] == argv[3:]  # `python -m MODULE`: sys.argv[0] is its path
    assert got["env"]["ODD"] == ODD and got["env"]["TOKEN"] == SECRET
    assert got["env"]["LLMFAB_RELEASE"] == str(rel).replace(str(lab.home(HOST)), "/root")
    # secrets: never on an argv (ps inside the host), never in the unit (readable by all),
    # only in server.env and secrets.json, both 0600
    ps = inside(lab, "ps", "-eo", "args", "ww")
    assert ps.returncode == 0 and "vllm" in ps.stdout and SECRET not in ps.stdout
    unit_file = inside(lab, "systemctl", "cat", unit["name"]).stdout
    assert "EnvironmentFile=" in unit_file and SECRET not in unit_file and "TOKEN" not in unit_file
    mode = inside(lab, "stat", "-c", "%a", "/etc/systemd/system/llmfab-sd-life.service").stdout.strip()
    assert mode == "644"
    assert stat.S_IMODE((rel / "server.env").stat().st_mode) == 0o600
    assert "TOKEN=" in (rel / "server.env").read_text()
    # bench and tail-log read the unit's server like any other
    b = run(lab, "bench", "--requests", "4", "--concurrency", "2", "--max-tokens", "8", "--json", profile=prof)
    assert json.loads(b.stdout.splitlines()[-1])["ok"]
    log = run(lab, "tail-log", "--lines", "50", profile=prof).stdout
    assert "Application startup complete." in log
    run(lab, "stop", profile=prof)
    st, _ = status(lab, prof)
    assert not st["running"] and st["unit"]["ActiveState"] in ("inactive", "failed")
    assert st["unit"]["UnitFileState"] == "disabled"  # stopped stays stopped after a reboot


def test_kill9_is_restarted_by_systemd_only_after_the_gpu_memory_is_free(lab):
    name = "sd-kill"
    fake = lab.fakegpu_dir(HOST)
    (fake / "teardown_s").write_text("1.5")  # the "driver" frees a dead holder's memory 1.5 s late
    (fake / "readings.jsonl").write_text("")
    prof = profile(lab, name, 31202, {"STANDIN_GPU_MIB": "4096"}, {"restart": "on-failure", "backoff": 0.2})
    try:
        run(lab, "deploy", profile=prof)
        first = server_json(lab, name)["pid"]
        killed_at = time.time()
        assert inside(lab, "kill", "-9", str(first)).returncode == 0

        def again():
            st, r = status(lab, prof)
            return st if r.returncode == 0 and st["unit"]["NRestarts"] == 1 and st["health"] == 200 else None
        st = wait_for(again, 60, "systemd's restart, ready again")
        assert st["pid"] != first and st["unit"]["ActiveState"] == "active"
        readings = [json.loads(x) for x in (fake / "readings.jsonl").read_text().splitlines()]
        regs = [json.loads(p.read_text()) for p in (fake / "procs").glob("*.json")]
        first_alloc = min(r["registered_at"] for r in regs if r["registered_at"] > killed_at)
        after = [x for x in readings if x["t"] > killed_at]
        held = [x for x in after if x["lingering"]]
        clear = [x for x in after if x["t"] < first_alloc and not x["lingering"] and all(v == 4 for v in x["used"].values())]
        assert held, "no reading saw the dead server's memory: the wait was not exercised"
        assert clear and max(x["t"] for x in held) < min(x["t"] for x in clear) < first_alloc
        log = (current(lab, name) / "server.log").read_text()
        assert "llmfab: waiting for the GPU memory to come back to the baseline" in log
        assert log.count("Application startup complete.") == 2
        ex = json.loads((current(lab, name) / "exit.json").read_text())
        assert ex["returncode"] == -9 and ex["pid"] == first  # ExecStopPost recorded the kill
    finally:
        run(lab, "stop", profile=prof)
        (fake / "teardown_s").unlink(missing_ok=True)
        (fake / "readings.jsonl").unlink(missing_ok=True)


def test_a_hung_server_is_killed_by_the_units_hang_watch_and_restarted_by_systemd(lab):
    """[supervise] hang_timeout under systemd: SIGSTOP of the server (it answers nothing, and
    systemd sees it running) is seen by the unit's hang watch (ExecStartPost), which kills it;
    Restart=on-failure starts it again, ready, and the log says why."""
    name = "sd-hang"
    prof = profile(lab, name, 31206, supervise={"restart": "on-failure", "backoff": 0.2, "hang_timeout": 3})
    try:
        run(lab, "deploy", profile=prof)
        text = inside(lab, "systemctl", "cat", f"llmfab-{name}.service").stdout
        assert "ExecStartPost=" in text and '"watch"' in text, text
        first = server_json(lab, name)["pid"]
        stopped_at = time.monotonic()
        assert inside(lab, "kill", "-STOP", str(first)).returncode == 0

        def again():
            st, r = status(lab, prof)
            return st if r.returncode == 0 and st["unit"]["NRestarts"] >= 1 and st["health"] == 200 \
                and st["pid"] != first else None
        wait_for(again, 60, "the hung server restarted by systemd")
        took = time.monotonic() - stopped_at
        assert took < 3 + 5 + 30, took  # hang_timeout + a probe + a restart with margin
        log = (current(lab, name) / "server.log").read_text()
        assert "llmfab: hung: no /health 200 for" in log and f"SIGKILL to pid {first}, systemd restarts it" in log
    finally:
        run(lab, "stop", profile=prof)


def test_stop_ends_a_sigterm_ignoring_child_that_left_the_group_after_the_grace(lab):
    name = "sd-term"
    prof = profile(lab, name, 31203, {"STANDIN_IGNORE_TERM": "1", "STANDIN_WORKER_SETSID": "1"})
    run(lab, "deploy", profile=prof)
    unit = "llmfab-sd-term.service"
    cgroup = inside(lab, "systemctl", "show", "-p", "ControlGroup", "--value", unit).stdout.strip()
    procs = inside(lab, "sh", "-c", "cat /sys/fs/cgroup/unified%s/cgroup.procs /sys/fs/cgroup%s/cgroup.procs "
                                    "2>/dev/null" % (cgroup, cgroup)).stdout.split()
    assert len(set(procs)) >= 2  # the server and its engine child (own session), one cgroup
    t0 = time.monotonic()
    out = run(lab, "stop", "--grace", "2", profile=prof).stdout
    took = time.monotonic() - t0
    assert 2.0 <= took < 20, took
    assert "SIGKILL" in out or "killed" in out, out
    left = inside(lab, "sh", "-c", "cat /sys/fs/cgroup/unified%s/cgroup.procs /sys/fs/cgroup%s/cgroup.procs "
                                   "2>/dev/null || true" % (cgroup, cgroup)).stdout.split()
    assert left == [] and not any(inside(lab, "kill", "-0", p).returncode == 0 for p in procs)
    assert "GPU memory back to its pre-launch baseline" in out


def test_rollback_switches_what_the_unit_runs(lab):
    name = "sd-roll"
    first = profile(lab, name, 31204, {"WHICH": "one"})
    run(lab, "deploy", profile=first)
    one = server_json(lab, name)["release"]
    time.sleep(1.1)  # release names are UTC stamps to the second
    second = profile(lab, name, 31204, {"WHICH": "two"})
    run(lab, "deploy", profile=second)
    two = server_json(lab, name)["release"]
    assert one != two
    unit_file = inside(lab, "cat", "/etc/systemd/system/llmfab-sd-roll.service").stdout
    assert f"WorkingDirectory=/root/llmfab/{name}/releases/{two}" in unit_file
    run(lab, "rollback", profile=second)
    st, r = status(lab, second)
    assert r.returncode == 0 and st["release"] == one and st["unit"]["ActiveState"] == "active"
    unit_file = inside(lab, "cat", "/etc/systemd/system/llmfab-sd-roll.service").stdout
    assert f"WorkingDirectory=/root/llmfab/{name}/releases/{one}" in unit_file
    got = json.loads((deploy_dir(lab, name) / "releases" / one / "standin-received.json").read_text())
    assert got["env"]["WHICH"] == "one" and got["pid"] == st["pid"]
    run(lab, "stop", profile=second)


def test_a_failed_start_is_explained_with_its_fix(lab):
    name = "sd-fail"
    prof = profile(lab, name, 31205, {"STANDIN_FAIL": "oom"})
    r = run(lab, "deploy", profile=prof, code=1)
    text = flat(r.stdout + r.stderr)
    assert re.search(r"out of memory|OutOfMemory|CUDA out of memory", text, re.I), text[-2000:]
    assert "fix" in text
    st, _ = status(lab, prof)
    assert st["state"] == "failed" and st["fatal"]["rule"] and st["fatal"]["fix"]
    assert st["runtime"] == "systemd" and st["unit"]["ActiveState"] in ("inactive", "failed")


def test_after_a_reboot_the_enabled_unit_serves_again_and_the_other_stays_down(lab):
    on, off = "sd-boot", "sd-noboot"
    p_on = profile(lab, on, 31206, enable=True)
    p_off = profile(lab, off, 31207, enable=False)
    run(lab, "deploy", profile=p_on)
    run(lab, "deploy", profile=p_off)
    before = server_json(lab, on)["pid"]
    box = lab.systemd(HOST)
    box.poweroff()
    box.boot()

    def serving():
        st, r = status(lab, p_on)
        return st if r.returncode == 0 and st["health"] == 200 else None
    st = wait_for(serving, 60, "the enabled unit to serve after the reboot")
    assert st["unit"]["ActiveState"] == "active" and st["unit"]["UnitFileState"] == "enabled"
    assert st["release"] == server_json(lab, on)["release"] and st["pid"] == server_json(lab, on)["pid"]
    assert st["pid"] != before or True  # a new boot's pid namespace may hand out the same number
    human = flat(run(lab, "status", profile=p_on).stdout)
    assert "running: release" in human and "unit llmfab-sd-boot.service active (running)" in human
    down, r = status(lab, p_off)
    assert r.returncode != 0 and not down["running"] and down["unit"]["UnitFileState"] == "disabled"
    run(lab, "stop", profile=p_on)


def test_the_check_fails_naming_systemd_on_a_host_whose_pid_1_is_not(lab, tmp_path):
    # the lab's plain hosts run no systemd; here the nspawn host is asked for a profile whose
    # check runs on this machine instead ("local": PID 1 here is not systemd)
    lines = ["[target]", 'hosts = ["local"]', 'name = "sd-local"', f'workdir = "{tmp_path}"',
             "[server]", 'engine = "command"', 'runtime = "systemd"', 'command = ["/bin/true"]']
    prof = write_profile(lab, "sd-local", lines)
    with open("/proc/1/comm") as f:
        if f.read().strip() == "systemd":
            pytest.skip("this machine's PID 1 is systemd: the FAIL cannot be shown here")
    r = lab.fab("check", profile=prof, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'runtime = "systemd", but PID 1 on this host is' in flat(r.stdout)
