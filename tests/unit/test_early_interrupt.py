"""A Ctrl-C in fab's first moments (llmfab's imports, Invoke's parsing, before any task runs)
exits 130 with one line and no traceback, as a task's own Ctrl-C does; Invoke alone makes it
exit 1. A real `fab` process and a real SIGINT: the fabfile here loads llmfab, says so, and
then blocks, standing for imports still going when the user presses Ctrl-C."""
import os
import signal
import subprocess
import sys

from hostlab import REPO

FABFILE = """
import signal, sys
from tasks import ns  # noqa: F401  (llmfab's collection, as the checkout's fabfile.py loads it)
sys.stdout.write("llmfab imported\\n")
sys.stdout.flush()
signal.pause()
"""


def test_ctrl_c_while_fab_loads_llmfab_exits_130_without_a_traceback(tmp_path):
    (tmp_path / "fabfile.py").write_text(FABFILE)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "fabric", "status"], cwd=str(tmp_path), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "llmfab imported\n"  # the process is inside the load
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, (p.returncode, err)
    assert err.strip() == "interrupted (Ctrl-C): nothing was done on any host", err
