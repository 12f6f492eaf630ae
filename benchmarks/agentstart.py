"""Time the host agent's start over SSH, cold and warm (benchmarks/agentcases.py runs it).

    python benchmarks/agentstart.py TREE SSH_CONFIG HOST HOST_HOME CPUACCT REPS PYTHON

Imports tasks.transport.agent from the llmfab checkout TREE (this one, or --before-tree's),
opens the SSH connection (untimed), then times Host.start(): the remote command through
the user's shell, the profile's Python, the agent's code (sent, or found in the host's
cache) and its hello record. "cold" first removes HOST_HOME/.cache/llmfab (a host that
never saw llmfab); "warm" keeps it. CPUACCT: the host's cgroup cpuacct.usage file (its
sshd and everything under it), read around each start. Prints JSON:
{"cold": [[wall_s, host_cpu_s], ...], "warm": [...]}, cold and warm interleaved.
"""
import json
import shutil
import sys
import time
from pathlib import Path


def main(tree, ssh_config, host, home, cpuacct, reps, python):
    sys.path.insert(0, tree)
    from fabric import Config

    from tasks.transport.agent import Host

    def cpu():
        return int(Path(cpuacct).read_text()) / 1e9 if cpuacct != "-" else 0.0

    out = {"cold": [], "warm": []}
    for rep in range(-1, int(reps)):
        for kind in ("cold", "warm"):
            if kind == "cold":
                shutil.rmtree(Path(home) / ".cache" / "llmfab", ignore_errors=True)
            h = Host(host, config=Config(runtime_ssh_path=ssh_config), python=python)
            h.connect()
            c0, t0 = cpu(), time.perf_counter()
            h.start()
            wall = time.perf_counter() - t0
            host_cpu = cpu() - c0
            h.close()
            if rep >= 0:
                out[kind].append([wall, host_cpu])
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
