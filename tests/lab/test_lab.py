"""The test lab itself: real OpenSSH servers in namespaces that look like separate machines."""
import os
import re
import subprocess
import time

import paramiko
import pytest

from hostlab import RUN_DIR, HostLab, wait_for

pytestmark = pytest.mark.e2e


def ssh(lab, alias, command, timeout=30, **kw):
    return subprocess.run(lab.ssh_argv(alias, command), capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_each_host_answers_openssh_as_itself(lab):
    assert lab.hosts == ["h1", "h2", "h3"]
    for alias in lab.hosts:
        r = ssh(lab, alias, "hostname; echo $HOME; hostname -I")
        assert r.returncode == 0, r.stderr
        name, home, ips = r.stdout.split("\n")[:3]
        assert (name, home, ips.strip()) == (alias, "/root", lab.ip(alias))
        # the copied ~/.bashrc (pyenv, cargo) runs and prints nothing on stderr
        assert r.stderr == ""
        assert "Accepted publickey for root" in lab.sshd_log(alias)


def test_paramiko_with_strict_host_keys(lab):
    client = paramiko.SSHClient()
    client.load_host_keys(str(lab.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(lab.ip("h2"), username="root", key_filename=str(lab.client_key),
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, out, _ = client.exec_command("hostname")
        assert out.read().decode().strip() == "h2"
        sftp = client.open_sftp()
        with sftp.open("/root/from-sftp.txt", "w") as f:
            f.write("hello")
        sftp.close()
    finally:
        client.close()
    assert (lab.home("h2") / "from-sftp.txt").read_text() == "hello"
    assert not (lab.home("h1") / "from-sftp.txt").exists()


def test_hosts_have_separate_root_tmp_and_bin(lab):
    r = ssh(lab, "h1", "echo one > ~/mark; echo one > /tmp/mark; command -v nvidia-smi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "/usr/local/bin/nvidia-smi"
    assert (lab.home("h1") / "mark").read_text() == "one\n"
    assert (lab.tmp("h1") / "mark").read_text() == "one\n"
    r = ssh(lab, "h2", "test ! -e ~/mark && test ! -e /tmp/mark && echo clean")
    assert r.stdout.strip() == "clean", r.stderr
    assert not os.path.exists("/usr/local/bin/nvidia-smi")  # only on test hosts
    assert lab.exec("h3", ["hostname"], capture_output=True, text=True).stdout.strip() == "h3"


def test_hosts_reach_each_other(lab):
    r = ssh(lab, "h1", "python3 -c 'import socket; socket.create_connection((\"%s\", 22), 5)"
                       ".recv(7)' && echo ok" % lab.ip("h3"))
    assert r.stdout.strip() == "ok", r.stderr


def test_nvidia_smi_over_ssh_reflects_registrations(lab):
    query = "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits"
    assert ssh(lab, "h1", query).stdout == "0, 4\n1, 4\n"
    holder = subprocess.Popen(lab.ssh_argv(
        "h1", "%s -c 'import os, time; from llmfab_standin import nvidia_smi; "
              "nvidia_smi.register(1, 3000); print(os.getpid(), flush=True); time.sleep(300)'"
        % lab.ml_python), stdout=subprocess.PIPE, text=True)
    try:
        pid = int(holder.stdout.readline())
        assert ssh(lab, "h1", query).stdout == "0, 4\n1, 3004\n"
        assert ssh(lab, "h2", query).stdout == "0, 4\n1, 4\n"  # other hosts: other GPUs
        apps = ssh(lab, "h1", "nvidia-smi --query-compute-apps=pid,used_memory "
                              "--format=csv,noheader,nounits").stdout
        assert apps == "%d, 3000\n" % pid
        lab.exec("h1", ["kill", str(pid)], check=True)
        wait_for(lambda: ssh(lab, "h1", query).stdout == "0, 4\n1, 4\n", 10, "memory freed")
    finally:
        holder.kill()
        holder.wait()


def test_unknown_host_key_is_refused(lab):
    r = ssh(lab, "unknownkey", "true")
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr
    client = paramiko.SSHClient()
    client.load_host_keys(str(lab.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        client.connect(lab.ip("unknownkey"), username="root", key_filename=str(lab.client_key),
                       look_for_keys=False, allow_agent=False, timeout=10)
    client.close()


def test_unreachable_and_silent_hosts_time_out(lab):
    started = time.monotonic()
    r = subprocess.run(lab.ssh_argv("silent", "true")[:1] + ["-o", "ConnectTimeout=2"]
                       + lab.ssh_argv("silent", "true")[1:], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 255 and "timed out" in r.stderr
    assert time.monotonic() - started < 15
    r = subprocess.run(["ssh", "-o", "ConnectTimeout=2"] + lab.ssh_argv("unreachable", "true")[1:],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 255
    assert re.search(r"No route to host|timed out|Connection refused", r.stderr), r.stderr


def test_kill_sessions_drops_a_live_session(lab):
    client = subprocess.Popen(lab.ssh_argv("h2", "echo $$; exec sleep 300"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = int(client.stdout.readline())
        assert lab.session_sshd_pids("h2")
        killed = lab.kill_sessions("h2")
        assert killed
        assert client.wait(10) == 255  # the client sees the connection drop
        assert lab.session_sshd_pids("h2") == []
        # what the session started keeps running, as after a real network drop
        assert lab.exec("h2", ["kill", "-0", str(pid)]).returncode == 0
        lab.exec("h2", ["kill", str(pid)], check=True)
        assert ssh(lab, "h2", "echo back").stdout == "back\n"
    finally:
        client.kill()
        client.wait()


def test_restart_sshd(lab):
    client = subprocess.Popen(lab.ssh_argv("h3", "echo up; exec sleep 300"),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline() == "up\n"
        before = lab.sshd_pid("h3")
        lab.restart_sshd("h3")
        assert lab.sshd_pid("h3") != before
        assert client.wait(10) == 255
        assert ssh(lab, "h3", "hostname").stdout == "h3\n"
    finally:
        client.kill()
        client.wait()


def test_fab_helper_runs_the_real_cli(lab):
    r = lab.fab("--list")
    assert r.returncode == 0, r.stderr
    assert "deploy" in r.stdout


def test_pid_namespace_host_and_cleanup(make_lab, lab):
    other = make_lab(2, pidns=(2,))
    assert other.slot != lab.slot and other.ip("h1") != lab.ip("h1")
    r = ssh(other, "h2", "echo $$; cat /proc/1/comm")
    pid, init = r.stdout.split()
    assert int(pid) < 100 and init == "python3", r.stdout
    assert int(ssh(other, "h1", "echo $$").stdout) > 100  # h1 shares the root PID namespace
    # like real nvidia-smi in a container: it reports host PIDs, not the ones inside
    holder = subprocess.Popen(other.ssh_argv(
        "h2", "%s -c 'import os, time; from llmfab_standin import nvidia_smi; "
              "nvidia_smi.register(0, 1000); print(os.getpid(), flush=True); time.sleep(300)'"
        % other.ml_python), stdout=subprocess.PIPE, text=True)
    try:
        inner = int(holder.stdout.readline())
        reported = int(ssh(other, "h2", "nvidia-smi --query-compute-apps=pid "
                                        "--format=csv,noheader").stdout)
        assert reported != inner
        with open("/proc/%d/status" % reported) as f:
            nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
        assert nspid == [str(reported), str(inner)]
        r = ssh(other, "h2", "test -e /proc/%d/fd/0 && echo visible || echo hidden" % reported)
        assert r.stdout.strip() == "hidden" or reported != inner
    finally:
        holder.kill()
        holder.wait()
    slot, root, netns = other.slot, other.root, ["lf%dh1" % other.slot, "lf%dh2" % other.slot]
    started = [other.sshd_pid("h1"), other.holder_pid("h2")]
    other.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed.split() for n in netns)
    assert not root.exists() and not (RUN_DIR / ("slot-%d" % slot)).exists()
    for pid in started:  # gone (a zombie awaiting init is gone too)
        try:
            with open("/proc/%d/stat" % pid) as f:
                assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            pass
    assert ssh(lab, "h1", "true").returncode == 0  # the session lab is untouched


def test_two_labs_start_at_once():
    import threading
    labs, errors = [], []

    def start():
        try:
            labs.append(HostLab(1))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert len({lab.slot for lab in labs}) == 2
        for one in labs:
            r = subprocess.run(one.ssh_argv("h1", "hostname"), capture_output=True, text=True,
                               timeout=30)
            assert r.stdout == "h1\n", r.stderr
    finally:
        for one in labs:
            one.close()
