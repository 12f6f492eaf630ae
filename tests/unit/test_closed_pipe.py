"""A closed stdout (`fab ... | head -1`, the reader gone before fab writes) ends fab quietly:
no traceback. Invoke's own printing (--list, --help TASK) ends with the status of a Unix tool
killed by SIGPIPE (141); a task goes on to its end, its output dropped, so a change in flight
on a host is finished, and exits with the task's own status. Real `fab` processes; the demo
profile on this machine ("local": no SSH)."""
import json
import os
import subprocess
import sys

from hostlab import REPO


def fab_into_closed_pipe(*args):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before fab writes a byte: every write is EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=str(REPO), stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    return p


def demo(tmp_path):
    path = tmp_path / "demo.toml"
    path.write_text("\n".join([f'extends = "{REPO / "configs" / "demo.toml"}"', "[target]",
                               f'workdir = "{tmp_path / "w"}"', 'name = "pipe"',
                               "[server]", "port = 18947", "[server.args]", "port = 18947",
                               "load-seconds = 0.2", ""]))
    return str(path)


def test_invokes_own_printing_into_a_closed_pipe_ends_quietly():
    for args in (["--list"], ["--help", "deploy"]):
        p = fab_into_closed_pipe(*args)
        assert p.returncode == 141 and "Traceback" not in p.stderr, (args, p.returncode, p.stderr)


def test_a_task_into_a_closed_pipe_finishes_its_change_and_says_nothing(tmp_path):
    prof = demo(tmp_path)
    try:
        p = fab_into_closed_pipe("deploy", "--profile", prof)
        assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
        st = subprocess.run([sys.executable, "-m", "fabric", "status", "--json", "--profile", prof],
                            cwd=str(REPO), capture_output=True, text=True, timeout=120)
        assert json.loads(st.stdout)["running"], st.stdout  # the deploy went through
        p = fab_into_closed_pipe("status", "--json", "--profile", prof)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    finally:
        subprocess.run([sys.executable, "-m", "fabric", "stop", "--profile", prof], cwd=str(REPO),
                       capture_output=True, timeout=120)
