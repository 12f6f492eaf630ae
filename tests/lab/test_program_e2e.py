"""The installed `llmfab` program against a lab host, and the shipped demo run here."""
import os
import shutil
import signal
import subprocess
import pytest
from hostlab import REPO, wait_for
from installs import installed, ok, run, userdir  # noqa: F401 (fixtures)


HOST_PYTHON = "/usr/bin/python3"


PORT = 18470


def test_a_relative_profile_is_found_in_the_users_directory_and_deploys_to_a_lab_host(installed, userdir, lab):
    _, bin_dir, how = installed
    shutil.copy(REPO / "configs" / "demo_server.py", userdir / "demo_server.py")
    name = f"userprof-{how}"
    (userdir / "p.toml").write_text("\n".join([
        "[target]", f'name = "{name}"',
        "[server]", 'engine = "command"', f'python = "{HOST_PYTHON}"',
        f'command = ["{HOST_PYTHON}", "demo_server.py"]', 'files = ["demo_server.py"]',
        'host = "127.0.0.1"', f"port = {PORT}",
        "[server.args]", f"port = {PORT}", 'host = "127.0.0.1"', 'served-model-name = "m"', "load-seconds = 0.5",
        "[ready]", 'served_name = "m"', "timeout = 60", "poll_interval = 0.3", ""]))
    llmfab = [bin_dir / "llmfab", "-S", lab.ssh_config]
    try:
        r = ok(run(llmfab + ["deploy", "--profile", "./p.toml", "-H", "h1"], cwd=userdir))
        assert "[h1] ready in" in r.stdout, r.stdout
        current = (lab.home("h1") / "llmfab" / name / "current").resolve()
        assert (current / "demo_server.py").read_bytes() == (userdir / "demo_server.py").read_bytes()
        assert "[h1] running" in ok(run(llmfab + ["status", "--profile", "p.toml", "-H", "h1"], cwd=userdir)).stdout
        # No task, a command after `--`: Fabric's own run-on-hosts mode, as with fab.
        assert ok(run(llmfab + ["-H", "h1", "--", "hostname"], cwd=userdir)).stdout.strip() == "h1"
    finally:
        ok(run(llmfab + ["stop", "--profile", "p.toml", "-H", "h1"], cwd=userdir))


class PrivateNetwork:
    """A network namespace with loopback up; `argv()` enters it (network only: the mount
    namespace stays this one, so `stop` sees the processes `deploy` started)."""

    def __init__(self, name):
        self.name = name
        subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)

    def argv(self, *argv):
        return ["nsenter", f"--net=/run/netns/{self.name}", "--"] + list(argv)

    def pids(self):
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def close(self):
        for pid in self.pids():  # only what a failed test left running in it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not self.pids(), 10, f"processes in netns {self.name} to end")
        subprocess.run(["ip", "netns", "del", self.name], check=True)


@pytest.mark.e2e
def test_llmfab_deploy_without_a_profile_runs_the_shipped_demo_here(installed, userdir, tmp_path):
    from conftest import require_lab
    require_lab()  # root and iproute2, as for the lab
    _, bin_dir, how = installed
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}  # no ~/.fabric.yaml: llmfab.profile is unset, the demo is the default
    net = PrivateNetwork(f"llmfab-prog-{os.getpid()}-{how}")
    try:
        r = ok(run(net.argv(bin_dir / "llmfab", "deploy"), cwd=userdir, env=env))
        assert "[local] ready in" in r.stdout and "demo-model on port 18000" in r.stdout, r.stdout
        assert (home / "llmfab" / "demo" / "current" / "demo_server.py").is_file()
        assert "[local] running" in ok(run(net.argv(bin_dir / "llmfab", "status"), cwd=userdir, env=env)).stdout
        stopped = ok(run(net.argv(bin_dir / "llmfab", "stop"), cwd=userdir, env=env))
        assert "[local] stopped release" in stopped.stdout, stopped.stdout
        assert net.pids() == []
    finally:
        net.close()
