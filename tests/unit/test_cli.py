"""The command line itself, with no host: `fab --list` and `fab --help TASK` name every task and document every flag; bad arguments exit 2 with one line."""
import subprocess
import sys
import pytest
from hostlab import REPO


TASKS = ["bench", "check", "deploy", "kill-gpu-procs", "pull", "releases", "rollback", "sleep", "status", "stop", "tail-log", "targets",
         "tune", "wake"]


def test_fab_list_shows_every_task_with_a_summary():
    r = subprocess.run([sys.executable, "-m", "fabric", "--list"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ") and line.strip()
              and not line.startswith("   ")}
    assert sorted(listed) == TASKS
    assert all(len(line.split()) > 2 for line in listed.values())


@pytest.mark.parametrize("task", TASKS)
def test_fab_help_documents_every_flag(task):
    r = subprocess.run([sys.executable, "-m", "fabric", "--help", task], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    options = r.stdout.split("Options:", 1)[1]
    flags = [l for l in options.splitlines() if l.strip().startswith("-")]
    assert flags
    for line in flags:
        assert len(line.split("  ")) > 1 and line.rstrip().split("  ")[-1].strip(), f"undocumented: {line}"


@pytest.mark.parametrize("argv", [["status", "--parallel", "abc"], ["deploy", "--bogus"],
                                  ["deploy", "--timeout", "soon"]])
def test_bad_arguments_exit_2_with_one_line(argv):
    r = subprocess.run([sys.executable, "-m", "fabric"] + argv, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")


@pytest.mark.parametrize("argv, said", [
    (["status", "--profile"], "error: --profile needs a value"),
    (["--profile", "p.toml", "status"], "error: --profile is a flag of the task, not of fab: write it "
                                        "after the task name (fab status --profile ...)"),
    (["status", "--bogus"], "error: status has no flag --bogus"),
    (["--bogus", "status"], "error: unknown flag --bogus"),
    (["stauts"], "error: no task 'stauts'; `fab --list` lists them"),
])
def test_parse_errors_name_the_flag_as_typed_never_invokes_objects(argv, said):
    # Invoke says "Flag <Argument: profile> needed value and was not given one!".
    r = subprocess.run([sys.executable, "-m", "fabric"] + argv, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith(said), r.stderr
    assert "<Argument" not in r.stderr and "No idea" not in r.stderr
