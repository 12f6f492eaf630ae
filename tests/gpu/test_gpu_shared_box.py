"""Several deployments on one real GPU with the real vLLM, over SSH (issue 36).

Three tiny-model deployments on GPU 0 of the H200 at gpu-memory-utilization 0.3 each: `v`, `s`
and `t` (`t` supervised, restart on-failure, hang_timeout 20). In order, each step what a user
did when llmfab still thought one deployment owned the box:
- status of one names the other two as other deployments; check WARNs that GPU 0 is shared;
- `kill-gpu-procs --profile s --dry-run` leaves v's and t's engines alone, in words;
- `fab stop --profile v` while s and t serve: exit 0 in seconds, they still answer;
- `kill -9` of s's API server: the EngineCore that vLLM renamed with setproctitle (its
  environment wiped) is s's orphan in status; check and deploy refuse it; `kill-gpu-procs
  --profile s` frees it and leaves t serving;
- SIGSTOP of t's API server: the supervisor's hang watch restarts it;
- stop t: the GPU back to its baseline, no VLLM:: process;
- another process holds 100 GiB: check and deploy of gpu-memory-utilization 0.9 FAIL before any
  launch, with both numbers and the largest fraction that fits.
Every fab run's output and the figures go to LLMFAB_GPU_OUT (fab.log, figures.json).
"""
import json
import time

import pytest

import gpuvllm as g

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not g.HOST, reason="LLMFAB_GPU_HOST is not set")]
EAGER = {"enforce-eager": True}  # the start is what is measured elsewhere; here, who owns what
HANG = 20


@pytest.fixture(scope="module")
def host():
    return g.idle_host("shared-box tests")


def flat(r):
    """fab's words without the [host] prefixes and the wrapping."""
    text = r.stdout + r.stderr
    return " ".join(" ".join(line.split("] ", 1)[-1] if line.startswith("[") else line
                             for line in text.splitlines()).split())


def server_json(host, name):
    return json.loads(host.run(["cat", f"{g.WORKDIR}/{name}/server.json"]))


def status(prof, code=0):
    r, _ = g.fab(prof, "status", "--json", code=code)
    return g.json_line(r)


def engines(host):
    return sorted(p for p, c in host.vllm_procs().items() if "EngineCore" in c)


def test_three_deployments_on_one_gpu(host, tmp_path):
    p = {n: g.profile(tmp_path / f"{n}.toml", f"gpu-{n}", port, args=EAGER,
                      extra=('[supervise]\nrestart = "on-failure"\nbackoff = 1\nhang_timeout = %d' % HANG
                             if n == "t" else ""))
         for n, port in (("v", 18361), ("s", 18362), ("t", 18363))}
    try:
        _run(host, p, tmp_path)
    finally:
        for prof in p.values():
            g.fab(prof, "stop", code=None)
        g.fab(p["s"], "kill-gpu-procs", code=None)


def _run(host, p, tmp_path):
    ready = {}
    for n in ("v", "s", "t"):
        r, wall = g.fab(p[n], "deploy", "--json")
        ready[n] = {"wall_s": round(wall, 1), "ready_s": g.json_line(r).get("ready_s")}
    srv = {n: server_json(host, f"gpu-{n}") for n in p}
    used, procs = host.gpu("three deployed")
    g.figure("shared_deploys", {"ready": ready, "identity": {n: s.get("identity") for n, s in srv.items()},
                                "gpu_used_mib": used, "baseline_mib": host.baseline, "apps": procs})
    assert len(engines(host)) == 3

    # 1. each knows its own: v's EngineCore is v's, the others named by deployment and release
    st = status(p["v"])
    mine = [h for h in st["gpu_holders"] if h["ours"]]
    theirs = {h["pid"]: (h.get("deployment"), h.get("release")) for h in st["gpu_holders"] if not h["ours"]}
    g.figure("shared_status_v", {"identity": st.get("identity"), "holders": st["gpu_holders"]})
    assert mine and all(h["name"].startswith("VLLM::") or h["pid"] == st["pid"] for h in mine), mine
    assert {d for d, _ in theirs.values()} == {"gpu-s", "gpu-t"}, theirs
    assert {r for _, r in theirs.values()} == {srv["s"]["release"], srv["t"]["release"]}
    r, _ = g.fab(p["v"], "check")
    assert "GPU 0 is shared with another deployment: gpu-s" in flat(r), flat(r)

    # 2. the fix status suggests for s never takes its neighbours
    r, _ = g.fab(p["s"], "kill-gpu-procs", "--dry-run", "--json")
    plan = g.json_line(r)
    spared = {x["pid"]: x.get("spared") for x in plan["processes"]}
    g.figure("shared_kill_dry_run", plan["processes"])
    for h in [h for h in st["gpu_holders"] if h["ours"]]:
        assert (spared.get(h["pid"]) or "").startswith("another deployment gpu-v"), (h, spared)
    assert "left alone: another deployment gpu-v" in flat(r)

    # 3. stop one while two serve: exit 0, in seconds
    v_pids = [h["pid"] for h in mine]
    r, wall = g.fab(p["v"], "stop")
    used, procs = host.gpu("v stopped")
    g.figure("shared_stop_v", {"wall_s": round(wall, 2), "exit": r.returncode, "gpu_used_mib": used,
                               "lines": [ln for ln in (r.stdout + r.stderr).splitlines() if "GPU" in ln]})
    assert wall < 30, wall
    assert "GPU memory of this deployment freed" in flat(r), flat(r)
    assert not any(host.alive(x) for x in v_pids)
    assert status(p["s"])["health"] == 200 and status(p["t"])["health"] == 200

    # 4. kill -9 of s's API server: its EngineCore stays, renamed and without our marker
    before = set(engines(host))
    host.run(["kill", "-9", str(srv["s"]["pid"])])
    host.wait("s's API server gone", lambda: not host.alive(srv["s"]["pid"]), 30)
    st = status(p["s"], code=1)
    orphans = [h for h in st["gpu_holders"] if h["ours"]]
    r, _ = g.fab(p["s"], "status", code=1)
    g.figure("shared_orphan_status", {"holders": st["gpu_holders"], "text": flat(r)})
    assert len(orphans) == 1 and orphans[0]["pid"] in before and orphans[0]["mib"] > 10000, orphans
    orphan = orphans[0]
    env = host.run(["cat", f"/proc/{orphan['pid']}/environ"], check=False)
    g.figure("shared_orphan_environ_has_marker", "LLMFAB_RELEASE=" in env)
    assert f"pid {orphan['pid']} (VLLM::EngineCore) of release {srv['s']['release']}" in flat(r), flat(r)
    assert "with no server running" in flat(r) and "fab kill-gpu-procs --profile" in flat(r)
    r, _ = g.fab(p["s"], "check", code=1)
    assert f"pid {orphan['pid']}" in flat(r), flat(r)
    r, wall = g.fab(p["s"], "deploy", code=1)
    g.figure("shared_orphan_deploy_refused", {"wall_s": round(wall, 2), "text": flat(r)[-600:]})
    assert f"pid {orphan['pid']}" in flat(r)
    assert set(engines(host)) == before, "a deploy started beside the orphan"
    r, wall = g.fab(p["s"], "kill-gpu-procs", "--json")
    host.wait("the orphan gone", lambda: not host.alive(orphan["pid"]), 60)
    used, procs = host.gpu("s's orphan freed")
    g.figure("shared_orphan_freed", {"wall_s": round(wall, 2), "answer": g.json_line(r), "gpu_used_mib": used})
    t_status = status(p["t"])
    assert t_status["health"] == 200 and host.alive(srv["t"]["pid"])

    # 5. SIGSTOP of t's API server: restarted by the hang watch
    stopped_at = time.monotonic()
    host.run(["kill", "-STOP", str(srv["t"]["pid"])])
    states = []

    def restarted():
        r, _ = g.fab(p["t"], "status", "--json", code=None)
        if "{" not in r.stdout:
            return False
        rec = g.json_line(r)
        sup = rec.get("supervisor") or {}
        states.append((round(time.monotonic() - stopped_at, 1), sup.get("state"), sup.get("restarts"),
                       rec.get("pid"), rec.get("health")))
        return sup.get("restarts", 0) >= 1 and rec.get("health") == 200 and rec.get("pid") != srv["t"]["pid"]
    took = host.wait("t restarted after SIGSTOP", restarted, HANG + 30 + 240, every=2)
    g.figure("shared_hang_restart", {"seconds": round(took, 1), "hang_timeout": HANG, "states": states})
    assert not host.alive(srv["t"]["pid"])

    # 6. the last one stops: the GPU is back to where it was
    r, wall = g.fab(p["t"], "stop")
    used, procs = host.gpu("t stopped")
    g.figure("shared_stop_t", {"wall_s": round(wall, 2), "gpu_used_mib": used})
    assert used <= host.baseline + g.TOLERANCE_MIB and not procs and not host.vllm_procs()

    # 7. a foreign process holds 100 GiB: the ask of gpu-memory-utilization 0.9 cannot fit
    hog = tmp_path / "hog.py"
    hog.write_text("import torch, time, sys\nx = torch.empty(100 << 30, dtype=torch.uint8, device='cuda')\n"
                   "print('held', flush=True)\ntime.sleep(600)\n")
    host.run(["bash", "-c", f"cp {hog} /tmp/hog.py; setsid {g.TORCH_PY} /tmp/hog.py > /tmp/hog.out 2>&1 &"])
    try:
        host.wait("the hog holds its memory", lambda: "held" in host.run(["cat", "/tmp/hog.out"], check=False), 120)
        greedy = g.profile(tmp_path / "greedy.toml", "gpu-greedy", 18364,
                           args=dict(EAGER, **{"gpu-memory-utilization": 0.9}))
        r, _ = g.fab(greedy, "check", code=1)
        text = flat(r)
        r2, wall = g.fab(greedy, "deploy", code=1)
        g.figure("shared_memory_preflight", {"check": text[-900:], "deploy_wall_s": round(wall, 2),
                                             "deploy": flat(r2)[-600:]})
        assert "gpu-memory-utilization 0.9 x" in text and "is free" in text and "at most 0." in text, text
        assert not host.vllm_procs()
    finally:
        host.run(["pkill", "-f", "/tmp/hog.py"], check=False)
