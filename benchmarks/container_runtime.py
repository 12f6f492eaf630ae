"""Deploy-to-ready and stop of the stand-in vLLM under runtime = "process" and "podman", in one
lab run, alternating (issue 40).

    python benchmarks/container_runtime.py [--rounds 5] [--out FILE]

One lab host with rootful podman (tests/podmanlab.py: the lab's Debian image). Each round
deploys the same stand-in server (STANDIN_LOAD_SECONDS=0.3) under each runtime and stops it
(grace 30 s), recording `fab deploy`'s wall time, the `ready_s` it reports (launch -> ready),
and `fab stop`'s wall time; then the same stop with a server and child that ignore SIGTERM
(grace 2 s: the engine's KILL after the grace, or llmfab's). Medians and each sample as JSON.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from podmanlab import podman_lab  # noqa: E402
from helpers import write_profile  # noqa: E402

SECRET = "bench-secret"


def profile(lab, pod, runtime, port, env=()):
    name = f"bench-{runtime}"
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"', "[server]", 'engine = "vllm"',
             f'python = "{lab.ml_python}"', f'runtime = "{runtime}"', f'model = "{lab.model_dir("bench-model")}"',
             'host = "127.0.0.1"', f"port = {port}", "[server.env]", 'STANDIN_LOAD_SECONDS = "0.3"']
    lines += [f'{k} = "{v}"' for k, v in dict(env).items()]
    lines += ["[ready]", "timeout = 60", "poll_interval = 0.2"]
    if runtime == "podman":
        lines += ["[container]", f'image = "{pod.image}"', 'gpus = "none"',
                  f'mounts = ["{lab.ml_env}:{lab.ml_env}:ro", "/tmp/fakegpu:/tmp/fakegpu", '
                  '"/proc:/tmp/fakegpu/hostproc:ro"]']
    return write_profile(lab, name + ("-term" if env else ""), lines)


def timed(lab, *args, profile):
    t0 = time.monotonic()
    r = lab.fab(*args, profile=profile, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return time.monotonic() - t0, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    samples = {rt: {"deploy_s": [], "ready_s": [], "stop_s": [], "stop_ignoring_term_s": []}
               for rt in ("process", "podman")}
    with podman_lab(1) as (lab, pod):
        lab.ml_env  # noqa: B018 (built before the clock runs)
        profs = {rt: profile(lab, pod, rt, 31400 + i) for i, rt in enumerate(samples)}
        terms = {rt: profile(lab, pod, rt, 31410 + i, {"STANDIN_IGNORE_TERM": "1"}) for i, rt in enumerate(samples)}
        timed(lab, "deploy", profile=profs["podman"])  # a first start warms the image's page cache
        timed(lab, "stop", profile=profs["podman"])
        for _ in range(args.rounds):
            for rt, prof in profs.items():
                wall, r = timed(lab, "deploy", "--json", profile=prof)
                samples[rt]["deploy_s"].append(round(wall, 3))
                samples[rt]["ready_s"].append(json.loads(r.stdout.splitlines()[-1])["ready_s"])
                samples[rt]["stop_s"].append(round(timed(lab, "stop", profile=prof)[0], 3))
        for rt, prof in terms.items():
            timed(lab, "deploy", profile=prof)
            samples[rt]["stop_ignoring_term_s"].append(round(timed(lab, "stop", "--grace", "2", profile=prof)[0], 3))
    result = {rt: {k: {"median": statistics.median(v), "samples": v} for k, v in s.items()}
              for rt, s in samples.items()}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for k in ("deploy_s", "ready_s", "stop_s", "stop_ignoring_term_s"):
        p, c = result["process"][k]["median"], result["podman"][k]["median"]
        print(f"{k:22} process {p:6.2f} s   podman {c:6.2f} s   podman - process {c - p:+.2f} s")


if __name__ == "__main__":
    main()
