"""A member's new release behind the endpoint, and rollback to a parked one (issue 39, item 4),
on the H200 with the real vLLM 0.26.0.

Run on the GPU machine itself, after vllm-kit's `install`, sshd-up.sh and hap-up.sh (as
benchmarks/h200_endpoint.py):

    python3 benchmarks/h200_endpoint_swap.py --out DIR --haproxy /tmp/hap/haproxy-run --phase fit
    python3 benchmarks/h200_endpoint_swap.py --out DIR --haproxy /tmp/hap/haproxy-run --phase park

One member (the kit's tiny target: vLLM, sleep mode, eager) behind one HAProxy endpoint:
  fit:  deployed with a 2 GB KV budget; then its profile changed and the endpoint deployed
        again under steady streamed load through the endpoint (4 clients): the new release
        starts in the other slot beside the old, the router switches, the old drains and
        stops. Figures: every request's outcome during the redeploy, the deploy's wall time,
        the switch time, GPU memory after.
  park: (continues from fit) the member at gpu-memory-utilization 0.6 (86 GB on the H200):
        the first change fits beside the 2 GB one; the second does not, so the old is parked
        while the new starts; then `fab rollback` twice (a wake and a switch each way): its
        wall time and the first token through the endpoint after it. Ends with fab stop.
Writes DIR/h200_endpoint_swap-<phase>.json and DIR/*.txt (what fab printed).
"""
import argparse
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import endpoint_routers as er  # noqa: E402  (its streamed client)
import h200_endpoint as he  # noqa: E402  (fab, gpu, first_token, the kit's paths)

PORT, ADMIN, MPORT = 8320, 8329, 8321
SERVED = "tiny-swap"


def write(work, haproxy, *, tag, util=0.2, kv=True):
    lines = ["[target]", 'hosts = ["gpu-local"]', 'name = "swap-m"',
             "[server]", 'engine = "vllm"', 'python = "/opt/torch/.venv/bin/python3"',
             f'model = "{he.MODELS / "target"}"', 'host = "127.0.0.1"', f"port = {MPORT}",
             "[server.args]", f'served-model-name = "{SERVED}"', "enable-sleep-mode = true",
             "enforce-eager = true", "max-model-len = 1024", f"gpu-memory-utilization = {util}"]
    lines += ["kv-cache-memory-bytes = 2000000000"] if kv else []
    lines += ["[server.env]"] + [f'{k} = "{v}"' for k, v in he.ENV.items()] + [f'RELEASE_TAG = "{tag}"']
    lines += ["[gpu]", "devices = [0]", "[ready]", "timeout = 400", "poll_interval = 0.5", ""]
    (work / "swap-m.toml").write_text("\n".join(lines))
    ep = work / "swap-ep.toml"
    ep.write_text("\n".join(["[endpoint]", 'name = "swapep"', f"port = {PORT}", f"admin_port = {ADMIN}",
                             f'members = ["{work / "swap-m.toml"}"]', f'haproxy = "{haproxy}"', ""]))
    return ep


class Load:
    """4 clients streaming completions for the member through the endpoint until stopped."""

    def __init__(self):
        self.outcomes, self.stop_flag = [], threading.Event()
        self.threads = [threading.Thread(target=self.client) for _ in range(4)]
        for t in self.threads:
            t.start()

    def client(self):
        while not self.stop_flag.is_set():
            t0 = time.time()
            ttft, total, tokens, intact, status = er.one_request(PORT, SERVED)
            self.outcomes.append({"at": round(t0, 3), "status": status, "intact": intact,
                                  "ttft_s": None if ttft is None else round(ttft, 3)})

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join()
        cut = [o for o in self.outcomes if o["status"] == 200 and not o["intact"]]
        held = [o for o in self.outcomes if o["status"] == 503]
        other = [o for o in self.outcomes if o["status"] not in (200, 503)]
        return {"requests": len(self.outcomes), "whole": sum(1 for o in self.outcomes if o["status"] == 200
                                                             and o["intact"]),
                "cut_streams": len(cut), "cut": cut[:10], "held_503": len(held),
                "held_window_s": round(max(o["at"] for o in held) - min(o["at"] for o in held), 2) if held else 0,
                "other_failures": len(other), "other": other[:10]}


def switch_line(text):
    return [ln for ln in text.splitlines() if "router sends it to slot" in ln or "stays parked" in ln
            or "drained" in ln or "new release in slot" in ln or "back to the" in ln]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--haproxy", default="haproxy")
    ap.add_argument("--phase", choices=("fit", "park", "both"), required=True)
    ap.add_argument("--work", default=None, help="where the profiles are written (the same for both phases)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else out / "profiles"
    work.mkdir(parents=True, exist_ok=True)
    try:
        for phase in (("fit", "park") if a.phase == "both" else (a.phase,)):
            (fit if phase == "fit" else park)(out, work, a.haproxy)
    except BaseException:
        he.fab(out, "stop-on-error", "stop", "--profile", work / "swap-ep.toml", code=None)
        raise
    finally:
        (out / f"h200_endpoint_swap-{a.phase}.json").write_text(json.dumps(he.RESULTS, indent=1, sort_keys=True))


def fit(out, work, haproxy):
    he.figure("baseline_mib", he.gpu()[0])
    ep = write(work, haproxy, tag="1")
    r, wall = he.fab(out, "deploy-1", "deploy", "--profile", ep)
    he.figure("first_deploy", {"wall_s": wall, "gpu_used_mib": he.gpu()[0], "answer": he.first_token(PORT, SERVED)})
    write(work, haproxy, tag="2")
    load = Load()
    time.sleep(3)  # steady load before the redeploy begins (a measurement window, not a wait on a state)
    r, wall = he.fab(out, "deploy-2-fit", "deploy", "--profile", ep)
    time.sleep(3)
    he.figure("redeploy_under_load_fit", {"wall_s": wall, "load": load.stop(), "lines": switch_line(r.stdout),
                                          "gpu_used_mib": he.gpu()[0]})
    he.fab(out, "status-fit", "status", "--profile", ep, code=None)


def park(out, work, haproxy):
    ep = write(work, haproxy, tag="3", util=0.6, kv=False)
    r, wall = he.fab(out, "deploy-3-big", "deploy", "--profile", ep)
    he.figure("big_beside_small", {"wall_s": wall, "lines": switch_line(r.stdout), "gpu_used_mib": he.gpu()[0]})
    write(work, haproxy, tag="4", util=0.6, kv=False)
    load = Load()
    r, wall = he.fab(out, "deploy-4-park", "deploy", "--profile", ep)
    he.figure("redeploy_not_fitting", {"wall_s": wall, "load": load.stop(), "lines": switch_line(r.stdout),
                                       "gpu_used_mib": he.gpu()[0], "apps_mib": he.gpu()[1]})
    rolls = []
    for i in range(2):
        r, wall = he.fab(out, f"rollback-{i + 1}", "rollback", "--profile", ep)
        t0 = time.monotonic()
        first = he.first_token(PORT, SERVED)
        rolls.append({"fab_rollback_wall_s": wall, "lines": switch_line(r.stdout), "first_token_after": first,
                      "to_serving_s": round(wall + (time.monotonic() - t0), 3), "gpu_used_mib": he.gpu()[0]})
    he.figure("rollback_to_parked", rolls)
    he.fab(out, "status-park", "status", "--profile", ep, code=None)
    r, wall = he.fab(out, "stop", "stop", "--profile", ep)
    he.figure("stop", {"wall_s": wall, "gpu_used_mib": he.gpu()[0]})


if __name__ == "__main__":
    main()
