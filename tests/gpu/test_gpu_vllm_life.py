"""The real vLLM on a real GPU through its whole life with llmfab, over SSH (issue 29).

check (engine identity, the model's config) -> deploy in compile mode, cold -> /health and
/v1/models -> status (GPU memory of the engine's process tree, KV cache usage, tokens/s) ->
bench -> tail-log -> redeploy warm (the kept compile cache: the cold/warm ratio and the
time-left estimate's error) -> rollback -> stop (memory back to the baseline, no VLLM::
process, port free); then supervision after `kill -9` of the API server (EngineCore keeps the
GPU: no relaunch into it; kill-gpu-procs frees it and the supervisor's restart comes up), and
the doctor's verdict of a random drafter (broken) and of ngram (judged) from real counters.

Settings: tests/gpu/gpuvllm.py. Skipped only when LLMFAB_GPU_HOST is unset.
"""
import json
import time

import pytest

import gpuvllm as g

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not g.HOST, reason="LLMFAB_GPU_HOST is not set")]
PORT = 18320


@pytest.fixture(scope="module")
def host():
    return g.idle_host("lifecycle tests")


def tree(host, root):
    """The pids of root and its descendants."""
    ps = host.procs()
    out, todo = {root}, [root]
    while todo:
        p = todo.pop()
        kids = [c for c, (pp, _) in ps.items() if pp == p]
        out.update(kids)
        todo += kids
    return out


def by_phase(rec):
    res = {}
    for p in rec.get("startup") or []:
        res[p["phase"]] = round(res.get(p["phase"], 0.0) + p["seconds"], 2)
    return res


def test_whole_life_on_the_gpu(host, tmp_path):
    prof = g.profile(tmp_path / "life.toml", "gpu-life", PORT)  # compile mode: no enforce-eager
    r, _ = g.fab(prof, "check")
    out = r.stdout + r.stderr
    assert f"vllm {g.VERSION}" in out and ("config.json" in out or g.MODEL in out), out

    # cold: a fresh deployment has an empty engine cache
    r, wall = g.fab(prof, "deploy", "--json")
    cold = g.json_line(r)
    g.figure("cold", {"wall_s": round(wall, 1), "startup": cold.get("startup"),
                      "compile_cache": cold.get("compile_cache"), "ready_s": cold.get("ready_s")})
    assert cold.get("compile_cache") in ("cold", None), cold.get("compile_cache")
    models = json.loads(host.get(PORT, "/v1/models"))
    assert models["data"][0]["id"] == "tiny"
    assert host.get(PORT, "/health") == ""

    st = g.json_line(g.fab(prof, "status", "--json")[0])
    pids = tree(host, st["pid"])
    used, procs = host.gpu("deployed (cold)")
    engine_mib = sum(m for p, m in procs.items() if p in pids)
    g.figure("engine_tree_mib", {"pids": sorted(p for p in procs if p in pids), "mib": engine_mib,
                                 "status_used_mib": st["gpus"][0]["used_mib"], "baseline": host.baseline})
    assert engine_mib > 10000  # gpu-memory-utilization 0.3 of an H200-class GPU
    assert set(procs) <= pids, f"a GPU process outside the server's tree: {procs}"
    assert st["running"] and st["health"] == 200 and st["served_name"] == "tiny"
    assert st["gpus"][0]["used_mib"] >= host.baseline + engine_mib - g.TOLERANCE_MIB

    r, _ = g.fab(prof, "bench", "--json", "--requests", "64", "--concurrency", "8", "--max-tokens", "128")
    bench = g.json_line(r)
    g.figure("bench", {k: bench.get(k) for k in ("output_tokens_per_s", "ttft_ms", "tpot_ms", "itl_ms",
                                                  "server_ms", "errors", "requests", "sampling")})
    assert bench["errors"] == 0 and bench["output_tokens_per_s"] > 100
    st = g.json_line(g.fab(prof, "status", "--json")[0])
    g.figure("status_after_bench", {k: st.get(k) for k in ("generation_tokens_per_s", "kv_cache_usage",
                                                           "requests_running", "gpus", "startup")})
    assert st["kv_cache_usage"] is not None
    g.fab(prof, "status")
    r, _ = g.fab(prof, "tail-log", "--lines", "5", "--grep", "Application startup|KV cache|Model loading")
    assert "Application startup complete." in r.stdout + r.stderr or "KV cache" in r.stdout + r.stderr

    # warm: the same profile again, the deployment's compile cache kept
    r, wall = g.fab(prof, "deploy", "--json")
    warm = g.json_line(r)
    est = g.estimates(r.stdout + r.stderr)
    ready = warm.get("ready_s") or wall
    errors = [round(e + left - ready, 1) for e, left in est]
    g.figure("warm", {"wall_s": round(wall, 1), "startup": warm.get("startup"),
                      "compile_cache": warm.get("compile_cache"), "ready_s": warm.get("ready_s"),
                      "estimates": est, "estimate_error_s": errors})
    if cold.get("ready_s") and warm.get("ready_s"):
        g.figure("warm_over_cold", round(warm["ready_s"] / cold["ready_s"], 3))
    assert warm.get("compile_cache") == "warm", warm.get("compile_cache")
    assert by_phase(warm).get("compile", 0) < by_phase(cold).get("compile", 1e9)
    assert est, "the second deploy showed no time-left estimate"

    # rollback: the previous release relaunched exactly as it was
    r, wall = g.fab(prof, "rollback", "--json")
    rb = g.json_line(r)
    g.figure("rollback", {"wall_s": round(wall, 1), "release": rb.get("release"),
                          "cold_release": cold.get("release"), "startup": rb.get("startup")})
    assert rb.get("release") == cold.get("release")
    g.fab(prof, "releases")

    st = g.json_line(g.fab(prof, "status", "--json")[0])
    pids = tree(host, st["pid"])
    r, wall = g.fab(prof, "stop")
    used, procs = host.gpu("after fab stop")
    m = [line for line in (r.stdout + r.stderr).splitlines() if "GPU memory back" in line]
    g.figure("stop", {"wall_s": round(wall, 2), "line": m, "used_after_mib": used})
    assert m, r.stdout + r.stderr
    assert used <= host.baseline + g.TOLERANCE_MIB and not procs
    assert not host.vllm_procs(), host.vllm_procs()
    assert not any(host.alive(p) for p in pids)
    assert host.port_free(PORT)


def test_supervision_does_not_relaunch_into_memory_an_orphan_holds(host, tmp_path):
    prof = g.profile(tmp_path / "sup.toml", "gpu-supervised", PORT + 1, args={"enforce-eager": True},
                     extra='[supervise]\nrestart = "on-failure"\nbackoff = 1\nmemory_timeout = 300')
    try:
        g.fab(prof, "deploy")
        api = g.json_line(g.fab(prof, "status", "--json")[0])["pid"]
        engine = next(p for p, c in host.vllm_procs().items() if "EngineCore" in c)
        host.run(["kill", "-9", str(api)])
        host.wait("the API server gone", lambda: not host.alive(api), 30)
        states, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 60:  # until the supervisor has the memory back (backoff)
            rec = g.json_line(g.fab(prof, "status", "--json", code=None)[0])
            states.append((round(time.monotonic() - t0, 1), (rec.get("supervisor") or {}).get("state"), rec.get("pid")))
            if states[-1][1] != "waiting-for-gpu" and len(states) > 1 and states[-2][1] == "waiting-for-gpu":
                break
            cores = [p for p, c in host.vllm_procs().items() if "EngineCore" in c]
            # Seen on the H200 (2026-12-03): the supervisor TERMs the dead attempt's group, so the
            # EngineCore goes (its memory over ~15 s); nothing new may start meanwhile, and the
            # supervisor may not say "running" while nothing runs.
            assert set(cores) <= {engine}, f"relaunched into the held memory: EngineCores {cores}"
            if cores or host.gpu("after kill -9")[0] > host.baseline + g.TOLERANCE_MIB:
                assert states[-1][1] != "running", states
        g.figure("supervised_after_kill9", {"states": states})
        assert any(s == "waiting-for-gpu" for _, s, _ in states), states
        r, wall = g.fab(prof, "kill-gpu-procs", "--json")
        g.figure("supervised_kill_gpu_procs", {"wall_s": round(wall, 2), "freed_mib": g.json_line(r).get("freed_mib")})
        t0 = time.monotonic()
        host.wait("the supervisor's restart ready",
                  lambda: g.fab(prof, "status", "--json", code=None)[0].returncode == 0, 240, every=1)
        rec = g.json_line(g.fab(prof, "status", "--json")[0])
        g.figure("supervised_restart", {"ready_after_free_s": round(time.monotonic() - t0, 1),
                                        "supervisor": rec.get("supervisor")})
        assert rec["supervisor"]["restarts"] >= 1
    finally:
        g.fab(prof, "stop", code=None)


@pytest.mark.parametrize("method", ["random-drafter", "ngram"])
def test_spec_verdict_from_real_counters(host, tmp_path, method):
    spec = ({"method": "draft_model", "model": g.DRAFTER, "num_speculative_tokens": 3} if method != "ngram"
            else {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    prof = g.profile(tmp_path / f"{method}.toml", f"gpu-{method}", PORT + 2,
                     args={"enforce-eager": True, "speculative-config": spec})
    try:
        g.fab(prof, "deploy")
        r, _ = g.fab(prof, "bench", "--json", "--requests", "24", "--max-tokens", "64", "--temperature", "0")
        rec = g.json_line(r)
        g.figure(f"verdict_{method}", rec.get("spec"))
        if method == "ngram":
            assert rec["spec"]["verdict"] in ("healthy", "low")
        else:
            assert rec["spec"]["verdict"] == "broken" and rec["spec"]["acceptance_rate"] < 0.05
    finally:
        g.fab(prof, "stop", code=None)
