"""Cases 1-3 of issue 8: launch the trivial server detached with each tool (benchmarks/suite.py, benchmarks/guard.py).

Tools: "ssh" (baseline_ssh.sh, x.py pre-placed), "ssh-kex" (the same with the kex paramiko
uses), "fabric" (baseline_fabric.py: Connection, or ThreadingGroup for several hosts),
"llmfab" (`fab deploy --no-wait`), "llmfab-before" (the same from another checkout),
"ansible" and "pyinfra" (thirdparty.py).
"""
import os
import subprocess
from pathlib import Path

from harness import HERE, PY, REPO, RunFailed, side_by_side

SSH_KEX = "-o KexAlgorithms=curve25519-sha256"  # what paramiko negotiates: no PQ hybrid


def tool_run(bench, tool, hosts, tools_ws=None, bins=None):
    """One timed launch of tiny_server.py on `hosts` by `tool` (see the docstring above)."""
    launcher = bench.fresh_launcher()
    env = dict(os.environ)
    after = None
    cwd = REPO
    if tool in ("ssh", "ssh-kex"):
        argv = [HERE / "baseline_ssh.sh", bench.cfg, *hosts]
        if tool == "ssh-kex":
            env["BASELINE_SSH_OPTS"] = SSH_KEX
    elif tool == "fabric":
        argv = [PY, HERE / "baseline_fabric.py", bench.cfg, launcher, *hosts]
    elif tool in ("llmfab", "llmfab-before"):
        # llmfab-before: the same command in another checkout (--before-tree), whose fabfile
        # and tasks/ fab then loads: a before/after comparison within one run.
        argv = [PY, "-m", "fabric", "-S", bench.cfg, "-H", ",".join(hosts), "deploy", "--no-wait",
                "--profile", bench.launch_profile]
        cwd = bench.before_tree if tool == "llmfab-before" else REPO
    elif tool == "ansible":
        env, extra, control_dir = tools_ws.ansible_env(launcher)
        argv = tools_ws.ansible_argv(bins, hosts) + extra
        after = lambda: close_masters(control_dir)  # noqa: E731
    elif tool == "pyinfra":
        argv = tools_ws.pyinfra_argv(bins, hosts)
        env = tools_ws.pyinfra_env(launcher)
    else:
        raise ValueError(tool)
    return bench.timed(argv, hosts, env=env, after=after, cwd=cwd)


def close_masters(control_dir):
    """End Ansible's ControlPersist masters of one run (`ssh -O exit` on each socket)."""
    for sock in Path(control_dir).iterdir():
        subprocess.run(["ssh", "-F", "/dev/null", "-o", "ControlPath=%s" % sock, "-O", "exit",
                        "bench"], capture_output=True, timeout=10)


def launch_case(bench, plan, reps, warmup=1, tools_ws=None, bins=None, log=print):
    """plan: [(n_hosts, [tool, ...])], run side by side (harness.side_by_side).
    Returns ({(n, tool): [run, ...]}, {(n, tool): [error]})."""
    def one(n, tool):
        return tool_run(bench, tool, bench.lab.hosts[:n], tools_ws, bins)
    return side_by_side(plan, reps, one, warmup=warmup, log=log,
                        errors=(RunFailed, TimeoutError, subprocess.TimeoutExpired))
