"""`llmfab` (issue 18): the installed program, run from a user's directory outside the repo.

llmfab is installed (editable, and a normal build) into a fresh virtualenv made for the test
module; its dependencies are this interpreter's, reached through a .pth file, so nothing is
downloaded. The user's directory has its own tasks.py: `llmfab --list` shows llmfab's tasks
(word for word what `fab --list` shows in the checkout), `invoke --list` the user's; a profile
given as ./p.toml is found there and deployed to a lab host; `llmfab deploy` with no profile
runs the shipped demo on this machine; `llmfab -H h1 -- CMD` runs CMD on h1, as fab does.
The demo runs in a network namespace of its own, with its own HOME, so its default port and
workdir never meet another run of the demo here.

Here: the rest; the tests on lab hosts are in tests/lab/test_program_e2e.py."""
import configparser
import functools
import shutil
import sys

import pytest
from hostlab import REPO
from installs import installed, ok, run, userdir  # noqa: F401 (fixtures)

# builds a wheel and a virtualenv (tens of seconds): not for tests/unit, which stays fast and pure
pytestmark = pytest.mark.e2e


# Every task of the checkout's collection (what `fab --list` shows there), sorted.
TASKS = sorted(name.replace("_", "-") for name in __import__("tasks").ns.task_names)


def test_setup_cfg_installs_every_subpackage_of_tasks_as_llmfab():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = set()
    for init in (REPO / "tasks").rglob("__init__.py"):
        rel = init.parent.relative_to(REPO / "tasks").parts
        found.add(".".join(("llmfab",) + rel))
    assert found <= listed, f"setup.cfg [options] packages misses {sorted(found - listed)}"


@functools.lru_cache(maxsize=None)
def fab_in_checkout(*args):
    """stdout of `fab ARGS` in the checkout (computed once for both installs)."""
    return ok(run([sys.executable, "-m", "fabric", *args], cwd=REPO)).stdout


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
    for argv, needle in ((["status", "--parallel", "abc"], "--parallel expects"),
                         (["deploy", "--bogus"], "`llmfab --help TASK`")):
        r = run([bin_dir / "llmfab"] + argv, cwd=userdir)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and needle in r.stderr, r.stderr


def test_the_config_key_llmfab_profile_comes_from_the_users_fabric_config(installed, userdir, tmp_path):
    _, bin_dir, _ = installed
    home = tmp_path / "home"
    home.mkdir()
    (home / ".fabric.yaml").write_text("llmfab:\n  profile: prod.toml\n")
    (userdir / "prod.toml").write_text((REPO / "configs" / "demo.toml").read_text())
    shutil.copy(REPO / "configs" / "demo_server.py", userdir / "demo_server.py")
    r = ok(run([bin_dir / "llmfab", "deploy", "--dry-run"], cwd=userdir, env={"HOME": str(home)}))
    assert r.stdout.startswith(f"profile: {userdir / 'prod.toml'} "), r.stdout
