"""runtime = "systemd" against "process" on one host: deploy-to-ready and stop time (issue 40).

    python benchmarks/run.py runtimes [--repeat 3]     # as root; needs .ci/run's lab rootfs

One lab host whose PID 1 is systemd (tests/systemdhost.py: systemd-nspawn with sshd inside)
takes the stand-in vLLM (0.3 s load) under both runtimes, alternating, `--repeat` times each:
`fab deploy` wall time and its ready_s (launch -> ready as the host saw it), then `fab stop`
wall time. Same host, same profile but for [server] runtime, so the difference is the unit's
cost (unit file, daemon-reload, systemctl, the ExecStartPre GPU wait, the exec step).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(argv):
    ap = argparse.ArgumentParser(prog="run.py runtimes", description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    from hostlab import HostLab
    from helpers import write_profile
    rows = {"process": [], "systemd": []}
    with HostLab(1, systemd=(1,)) as lab:
        profiles = {}
        for runtime in rows:
            lines = ["[target]", 'hosts = ["h1"]', f'name = "bench-{runtime}"', "[server]", 'engine = "vllm"',
                     f'runtime = "{runtime}"', f'python = "{lab.ml_python}"', f'model = "{lab.model_dir("b")}"',
                     'host = "127.0.0.1"', "port = 31300", "[ready]", "timeout = 60", "poll_interval = 0.2"]
            profiles[runtime] = write_profile(lab, f"bench-{runtime}", lines)
        for i in range(args.repeat):
            for runtime in (rows if i % 2 == 0 else list(rows)[::-1]):
                t0 = time.monotonic()
                r = lab.fab("deploy", "--json", profile=profiles[runtime], timeout=120)
                deploy_s = time.monotonic() - t0
                assert r.returncode == 0, r.stdout + r.stderr
                ready = json.loads(r.stdout.splitlines()[-1]).get("ready_s")
                t0 = time.monotonic()
                r = lab.fab("stop", profile=profiles[runtime], timeout=120)
                stop_s = time.monotonic() - t0
                assert r.returncode == 0, r.stdout + r.stderr
                rows[runtime].append((deploy_s, ready, stop_s))
    print("| runtime | fab deploy (s, median) | launch -> ready on the host (s) | fab stop (s) | runs |")
    print("| --- | --- | --- | --- | --- |")
    for runtime, xs in rows.items():
        med = [statistics.median(x[k] for x in xs if x[k] is not None) for k in range(3)]
        print("| %s | %.2f | %.2f | %.2f | %d |" % (runtime, med[0], med[1], med[2], len(xs)))
    return 0
