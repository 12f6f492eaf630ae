"""Fleets (issue 4): many hosts in parallel, and SSH hygiene, with the real `fab` and sshd.

One 8-host lab for the module (tests/hostlab.py) plus its `unreachable`, `unknownkey` and
`silent` hosts. The server is configs/demo_server.py (engine = "command"). Tests that
trust a new key or add ssh_config options work on copies of the lab's ssh_config and
known_hosts, so nothing they accept leaks into other tests.

Here: the rest; the tests that need no host are in tests/unit/test_fanout.py."""
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
import pytest
from hostlab import REPO, HostLab


HOST_PYTHON = "/usr/bin/python3"


PORT = 18400


@pytest.fixture(scope="module")
def lab():
    # Named `lab` so conftest marks every test using it e2e (and checks the prerequisites).
    from conftest import require_lab
    require_lab()
    with HostLab(8) as the_lab:
        yield the_lab


def demo_profile(lab, name, hosts=None):
    lines = ["[target]", f'name = "{name}"']
    lines += [f"hosts = {list(hosts)!r}".replace("'", '"')] if hosts else []
    lines += ["[server]", 'engine = "command"', f'python = "{HOST_PYTHON}"',
              f'command = ["{HOST_PYTHON}", "demo_server.py"]',
              f'files = ["{REPO / "configs" / "demo_server.py"}"]',
              'host = "127.0.0.1"', f"port = {PORT}",
              "[server.args]", f"port = {PORT}", 'host = "127.0.0.1"', 'served-model-name = "m"',
              "load-seconds = 0.5",
              "[ready]", 'served_name = "m"', "timeout = 60", "poll_interval = 0.3"]
    path = Path(lab.root) / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def fab(*args, ssh_config, profile, timeout=180):
    argv = [sys.executable, "-m", "fabric", "-S", str(ssh_config), *map(str, args),
            "--profile", str(profile)]
    return subprocess.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=timeout)


def ok(r, code=0):
    assert r.returncode == code, f"exit {r.returncode}, not {code}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def summary(stdout):
    """{host: (result, text)} from the summary table that ends the run."""
    lines = stdout.splitlines()
    start = max(i for i, l in enumerate(lines) if l.startswith("host "))
    rows = {}
    for line in lines[start + 1:]:
        host, result, *rest = line.split(None, 2) + [""]
        if result == "exit":
            code, _, text = rest[0].partition(" ")
            rows[host] = ("exit " + code, text.strip())
        else:
            rows[host] = (result, rest[0].strip())
    return rows, lines[:start]


def private_ssh_config(lab, tmp_path, prepend=""):
    """A copy of the lab's ssh_config whose known_hosts is a private copy; `prepend` comes
    first (ssh_config: the first value obtained wins)."""
    known = tmp_path / "known_hosts"
    shutil.copy(lab.known_hosts, known)
    text = Path(lab.ssh_config).read_text().replace(str(lab.known_hosts), str(known))
    cfg = tmp_path / "ssh_config"
    cfg.write_text(prepend + text)
    return cfg, known


def test_eight_hosts_deploy_in_parallel_and_an_unreachable_one_fails_alone(lab):
    prof = demo_profile(lab, "fleet", hosts=lab.hosts + ["unreachable"])
    try:
        _eight_hosts(lab, prof)
    finally:  # the other tests of this lab use the same port on these hosts
        fab("stop", "--grace", "5", "-H", ",".join(lab.hosts), ssh_config=lab.ssh_config, profile=prof)


def _eight_hosts(lab, prof):
    t0 = time.monotonic()
    r = ok(fab("deploy", ssh_config=lab.ssh_config, profile=prof), code=3)
    wall = time.monotonic() - t0
    rows, body = summary(r.stdout)
    assert set(rows) == set(lab.hosts) | {"unreachable"}
    for h in lab.hosts:
        assert rows[h][0] == "ok" and rows[h][1].startswith("ready in"), rows[h]
        assert f"[{h}] ready in" in r.stdout
    assert rows["unreachable"][0] == "exit 3"
    assert re.search(r"no route to host|did not answer within", rows["unreachable"][1]), rows
    # Every line before the summary names its host, as the user wrote it.
    names = "|".join(map(re.escape, rows))
    stray = [l for l in body if not re.match(rf"\[({names})\] ", l)]
    assert not stray, stray
    print(f"8 hosts + 1 unreachable deployed in {wall:.1f} s")

    st = ok(fab("status", "-H", ",".join(lab.hosts), ssh_config=lab.ssh_config, profile=prof))
    assert {v for v in summary(st.stdout)[0].values()} == {("ok", "healthy")}

    stop = ok(fab("stop", "--grace", "5", "-H", ",".join(lab.hosts), ssh_config=lab.ssh_config,
                  profile=prof))
    rows = summary(stop.stdout)[0]
    # Each host stops its own server (same path on every host: none may touch another's).
    assert all(v[1].startswith("stopped in") for v in rows.values()), stop.stdout


def test_connect_timeout_from_ssh_config(lab, tmp_path):
    cfg, _ = private_ssh_config(lab, tmp_path, "Host silent\n  ConnectTimeout 2\n\n")
    t0 = time.monotonic()
    r = ok(fab("-H", "silent", "check", ssh_config=cfg, profile=demo_profile(lab, "silent-cfg")), code=3)
    assert "did not answer within 2 s" in r.stdout and time.monotonic() - t0 < 8


def test_a_silent_host_fails_within_the_connect_timeout_while_others_finish(lab):
    prof = demo_profile(lab, "silent-mix")
    t0 = time.monotonic()
    r = ok(fab("-t", "2", "-H", "silent,h1", "check", ssh_config=lab.ssh_config, profile=prof), code=3)
    elapsed = time.monotonic() - t0
    rows = summary(r.stdout)[0]
    assert rows["h1"][0] == "ok" and rows["silent"][0] == "exit 3", r.stdout
    assert "did not answer within 2 s" in rows["silent"][1]
    assert elapsed < 8, f"took {elapsed:.1f} s with -t 2"


def test_unknown_host_key_is_refused_untouched_until_the_user_opts_in(lab, tmp_path):
    cfg, known = private_ssh_config(lab, tmp_path)
    prof = demo_profile(lab, "newkey", hosts=["unknownkey"])
    log_before = len(lab.sshd_log("unknownkey"))
    r = ok(fab("deploy", ssh_config=cfg, profile=prof), code=3)
    assert "unknown host key for" in r.stdout and "nothing was run there" in r.stdout
    assert "ssh-keyscan" in r.stdout and "--accept-new-host-keys" in r.stdout
    assert "StrictHostKeyChecking accept-new" in r.stdout
    # Nothing ran there: no login, no session, no deployment directory.
    log = lab.sshd_log("unknownkey")[log_before:]
    assert "Accepted publickey" not in log and "session" not in log.lower(), log
    assert not (lab.home("unknownkey") / "llmfab").exists()

    ok(fab("deploy", "--accept-new-host-keys", ssh_config=cfg, profile=prof))
    ip = lab.ip("unknownkey")
    assert any(l.startswith(ip + " ssh-ed25519 ") for l in known.read_text().splitlines())
    # Trusted now: no flag needed, and the key was appended, not the file rewritten.
    ok(fab("status", ssh_config=cfg, profile=prof))
    assert known.read_text().startswith(Path(lab.known_hosts).read_text())
    ok(fab("stop", "--grace", "5", ssh_config=cfg, profile=prof))


def test_strict_host_key_checking_accept_new_in_ssh_config_is_honoured(lab, tmp_path):
    cfg, known = private_ssh_config(lab, tmp_path, "Host unknownkey\n  StrictHostKeyChecking accept-new\n\n")
    prof = demo_profile(lab, "newkey-cfg", hosts=["unknownkey"])
    ok(fab("check", ssh_config=cfg, profile=prof))
    assert lab.ip("unknownkey") in known.read_text()


def test_a_changed_host_key_is_refused_even_with_accept_new(lab, tmp_path):
    cfg, known = private_ssh_config(lab, tmp_path)
    lines = [l.split() for l in known.read_text().splitlines()]
    other = next(l[2] for l in lines if l[0] == lab.ip("h1"))
    known.write_text("".join(" ".join(l[:2] + [other if l[0] == lab.ip("h3") else l[2]]) + "\n"
                             for l in lines))  # h3's address now "has" h1's key
    prof = demo_profile(lab, "changed", hosts=["h3"])
    r = ok(fab("check", "--accept-new-host-keys", ssh_config=cfg, profile=prof), code=3)
    assert "does NOT match" in r.stdout and "ssh-keygen -R" in r.stdout


def test_proxyjump_through_one_host_to_another(lab, tmp_path):
    h4 = next(b for b in Path(lab.ssh_config).read_text().split("\n\n") if b.startswith("Host h4\n"))
    cfg, _ = private_ssh_config(lab, tmp_path, h4.replace("Host h4\n", "Host behind-h1\n  ProxyJump h1\n") + "\n\n")
    prof = demo_profile(lab, "jumped", hosts=["behind-h1"])
    before = len(lab.sshd_log("h4"))
    r = ok(fab("check", ssh_config=cfg, profile=prof))
    assert "[behind-h1] connected: root@h4" in r.stdout
    # h4 saw the connection come from h1's address: it went through h1.
    log = lab.sshd_log("h4")[before:]
    assert f"Connection from {lab.ip('h1')} " in log, log
