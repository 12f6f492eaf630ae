"""Baseline: the minimal Fabric script of issue 8 (connect, put the launcher, launch, read the pid).

    python benchmarks/baseline_fabric.py SSH_CONFIG LAUNCHER HOST [HOST...]

One host: a `Connection`; several: a `ThreadingGroup` (one thread per host). LAUNCHER
(a 2 KB script, benchmarks/tiny_server.py) is put as ~/x.py, then started detached with
`setsid nohup /usr/bin/python3 x.py >x.log 2>&1 </dev/null & echo $!`, whose output is
the pid. Prints "HOST PID" per host. No host-key checking, locking, preflight or
readiness: this is the floor a Fabric user would write by hand.
"""
import sys

from fabric import Config, Connection, ThreadingGroup

LAUNCH = "setsid nohup /usr/bin/python3 x.py >x.log 2>&1 </dev/null & echo $!"


def main(argv):
    ssh_config, launcher, hosts = argv[0], argv[1], argv[2:]
    config = Config(runtime_ssh_path=ssh_config)
    if len(hosts) == 1:
        cxn = Connection(hosts[0], config=config)
        cxn.put(launcher, "x.py")
        print(hosts[0], cxn.run(LAUNCH, hide=True).stdout.strip())
        cxn.close()
        return 0
    group = ThreadingGroup(*hosts, config=config)
    group.put(launcher, "x.py")
    for cxn, result in group.run(LAUNCH, hide=True).items():
        print(cxn.original_host, result.stdout.strip())
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
