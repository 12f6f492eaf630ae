"""`llmfab` (issue 18): the installed program, run from a user's directory outside the repo.

llmfab is installed (editable, and a normal build) into a fresh virtualenv made for the test
module; its dependencies are this interpreter's, reached through a .pth file, so nothing is
downloaded. The user's directory has its own tasks.py: `llmfab --list` shows llmfab's tasks
(word for word what `fab --list` shows in the checkout), `invoke --list` the user's; a profile
given as ./p.toml is found there and deployed to a lab host; `llmfab deploy` with no profile
runs the shipped demo on this machine; `llmfab -H h1 -- CMD` runs CMD on h1, as fab does.
The demo runs in a network namespace of its own, with its own HOME, so its default port and
workdir never meet another run of the demo here.
"""
import configparser
import functools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from lab import REPO, wait_for

HOST_PYTHON = "/usr/bin/python3"
PORT = 18470
# Every task of the checkout's collection (what `fab --list` shows there), sorted.
TASKS = sorted(name.replace("_", "-") for name in __import__("tasks").ns.task_names)
USER_TASKS = 'from invoke import task\n\n\n@task\ndef hello(c):\n    """The user\'s own task."""\n'
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".hypothesis")


def test_setup_cfg_installs_every_subpackage_of_tasks_as_llmfab():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = set()
    for init in (REPO / "tasks").rglob("__init__.py"):
        rel = init.parent.relative_to(REPO / "tasks").parts
        found.add(".".join(("llmfab",) + rel))
    assert found <= listed, f"setup.cfg [options] packages misses {sorted(found - listed)}"


def _venv(root):
    """A fresh virtualenv whose site-packages also sees this interpreter's (for fabric & co)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # Lines of a .pth are only appended to sys.path: .pth files in those directories (an
    # editable install of another checkout, say) are not run, so they cannot leak in.
    outer = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(purelib, "_outer_site.pth").write_text("\n".join(sorted(outer)) + "\n")
    return python


@pytest.fixture(scope="module", params=["editable", "built"])
def installed(request, tmp_path_factory):
    """(venv python, bin directory, how) with llmfab installed from a copy of this checkout."""
    base = tmp_path_factory.mktemp(f"llmfab-{request.param}")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORE)
    python = _venv(base / "venv")
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
            "--no-build-isolation", "--no-index"] + (["-e", str(src)] if request.param == "editable" else [str(src)])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return python, python.parent, request.param


@pytest.fixture
def userdir(tmp_path):
    d = tmp_path / "my-profiles"
    d.mkdir()
    (d / "tasks.py").write_text(USER_TASKS)
    return d


def run(argv, cwd, env=None, timeout=180):
    full = dict(os.environ)
    full.pop("INVOKE_RUNTIME_CONFIG", None)
    full.update(env or {})
    return subprocess.run([str(a) for a in argv], cwd=str(cwd), env=full, capture_output=True, text=True,
                          timeout=timeout)


@functools.lru_cache(maxsize=None)
def fab_in_checkout(*args):
    """stdout of `fab ARGS` in the checkout (computed once for both installs)."""
    return ok(run([sys.executable, "-m", "fabric", *args], cwd=REPO)).stdout


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def listed(stdout):
    return [line.split()[0] for line in stdout.splitlines() if line.startswith("  ") and not line.startswith("   ")]


def test_the_installed_package_holds_every_file_of_the_checkouts_tasks(installed, userdir):
    # Code that ships files to a host (the agent's modules, the supervisor beside launch.py)
    # reads them next to itself: a file the distribution leaves out breaks only installed users.
    python, _, _ = installed
    code = ("import importlib.util as u, pathlib; "
            "root = pathlib.Path(u.find_spec('llmfab').origin).parent; "
            "print('\\n'.join(sorted(str(p.relative_to(root)) for p in root.rglob('*.py') "
            "if '__pycache__' not in p.parts)))")
    have = set(ok(run([python, "-c", code], cwd=userdir)).stdout.split())
    want = {str(p.relative_to(REPO / "tasks")) for p in (REPO / "tasks").rglob("*.py")
            if "__pycache__" not in p.parts}
    assert want <= have, f"not installed: {sorted(want - have)}"


def test_the_distribution_puts_no_top_level_tasks_on_sys_path(installed, userdir):
    python, _, _ = installed
    code = ("import importlib.metadata as m, importlib.util as u; "
            "print(sorted({f.parts[0] for f in m.files('llmfab')}), u.find_spec('tasks'), u.find_spec('llmfab.program').name)")
    r = ok(run([python, "-c", code], cwd=userdir.parent))  # a directory without a tasks.py
    tops, spec, program = r.stdout.rsplit(" ", 2)
    assert "'tasks'" not in tops and spec == "None" and program.strip() == "llmfab.program", r.stdout


def test_llmfab_lists_its_tasks_and_invoke_the_users_own(installed, userdir):
    python, bin_dir, _ = installed
    mine = ok(run([bin_dir / "llmfab", "--list"], cwd=userdir))
    assert listed(mine.stdout) == TASKS
    assert mine.stdout == fab_in_checkout("--list")
    theirs = ok(run([python, "-m", "invoke", "--list"], cwd=userdir))
    assert listed(theirs.stdout) == ["hello"]


def test_llmfab_keeps_fabs_help_and_exit_2_on_bad_arguments(installed, userdir):
    _, bin_dir, _ = installed
    for task in TASKS:
        mine = ok(run([bin_dir / "llmfab", "--help", task], cwd=userdir)).stdout
        fab = fab_in_checkout("--help", task)
        assert mine.split("\n", 1)[1] == fab.split("\n", 1)[1], task
        assert mine.startswith(f"Usage: llmfab [--core-opts] {task} ")
    core = ok(run([bin_dir / "llmfab", "--help"], cwd=userdir)).stdout
    for flag in ("--hosts", "--ssh-config", "--identity", "--connect-timeout", "--prompt-for-passphrase"):
        assert flag in core
    for argv in (["status", "--parallel", "abc"], ["deploy", "--bogus"]):
        r = run([bin_dir / "llmfab"] + argv, cwd=userdir)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and "`llmfab --help TASK`" in r.stderr, r.stderr


def test_the_config_key_llmfab_profile_comes_from_the_users_fabric_config(installed, userdir, tmp_path):
    _, bin_dir, _ = installed
    home = tmp_path / "home"
    home.mkdir()
    (home / ".fabric.yaml").write_text("llmfab:\n  profile: prod.toml\n")
    (userdir / "prod.toml").write_text((REPO / "configs" / "demo.toml").read_text())
    shutil.copy(REPO / "configs" / "demo_server.py", userdir / "demo_server.py")
    r = ok(run([bin_dir / "llmfab", "deploy", "--dry-run"], cwd=userdir, env={"HOME": str(home)}))
    assert r.stdout.startswith(f"profile: {userdir / 'prod.toml'} "), r.stdout


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
