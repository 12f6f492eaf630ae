"""The real vLLM on a real GPU, first: the three lies a GPU user met (issue 29).

1. `fab check` must judge the engine in the server's own environment: vLLM given by
   [server.env] PYTHONPATH is importable (the launch would work), and vLLM without torch is
   not an "engine OK" (the launch dies "No module named 'torch'").
2. After `kill -9` of the API server, VLLM::EngineCore keeps its GPU memory (vLLM issue
   #55510's shape): `fab status` must name it, its MiB and `fab kill-gpu-procs`; a deploy must
   not start into it (preflight FAIL naming the pid); kill-gpu-procs frees it.
3. The doctor's verdict for a correct drafter at the server's default temperature (1.0: vLLM
   drafts greedily, so acceptance is the target's probability of the greedy token) must not
   be `broken`; greedy it is healthy.

Settings: tests/gpu/gpuvllm.py. Skipped only when LLMFAB_GPU_HOST is unset.
"""
import json
import time

import pytest

import gpuvllm as g

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not g.HOST, reason="LLMFAB_GPU_HOST is not set")]


@pytest.fixture(scope="module")
def host():
    return g.idle_host("defect tests")


def test_check_imports_the_engine_with_the_servers_python_and_env(tmp_path):
    # vLLM only through [server.env] PYTHONPATH over the host's torch Python: the launch works
    good = g.profile(tmp_path / "env-site.toml", "gpu-env-site", 18310, python=g.TORCH_PY,
                     env={"PYTHONPATH": g.VLLM_SITE})
    r, wall = g.fab(good, "check", code=None)
    g.figure("check_env_site", {"exit": r.returncode, "s": round(wall, 2)})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"vllm {g.VERSION}" in out
    assert "not importable" not in out

    # vLLM visible but torch not: the launch would die "No module named 'torch'"
    bad = g.profile(tmp_path / "no-torch.toml", "gpu-no-torch", 18311, python=g.NOTORCH_PY)
    r, wall = g.fab(bad, "check", code=None)
    g.figure("check_no_torch", {"exit": r.returncode, "s": round(wall, 2)})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "torch" in out and f"engine OK vllm {g.VERSION}" not in out


def test_status_names_the_orphaned_engine_core_and_deploy_refuses_it(host, tmp_path):
    prof = g.profile(tmp_path / "orphan.toml", "gpu-orphan", 18312, args={"enforce-eager": True})
    r, wall = g.fab(prof, "deploy", "--json")
    g.figure("orphan_deploy_ready_s", round(wall, 1))
    api = g.json_line(g.fab(prof, "status", "--json")[0])["pid"]
    engines = {p: c for p, c in host.vllm_procs().items() if "EngineCore" in c}
    assert engines, host.procs()
    engine = next(iter(engines))
    _, procs = host.gpu("deployed, before kill -9 of the API server")
    held = procs.get(engine, 0)
    assert held > 1000, procs

    host.run(["kill", "-9", str(api)])
    host.wait("the API server gone", lambda: not host.alive(api), 30)
    time.sleep(2)  # the orphan's own reaction, if any, has had its chance: it is what we test
    assert host.alive(engine), "EngineCore exited with its API server: nothing orphaned here"
    _, procs = host.gpu("after kill -9 of the API server")
    g.figure("orphan_engine_core", {"pid": engine, "mib": procs.get(engine)})
    assert procs.get(engine, 0) > 1000

    r, _ = g.fab(prof, "status", code=None)
    out = r.stdout + r.stderr
    g.figure("orphan_status_exit", r.returncode)
    assert r.returncode == 1
    assert str(engine) in out and "kill-gpu-procs" in out, out
    assert str(procs[engine]) in out or f"{procs[engine] / 1024:.1f}" in out, out

    r, _ = g.fab(prof, "deploy", code=None)
    out = r.stdout + r.stderr
    g.figure("orphan_deploy_exit", r.returncode)
    assert r.returncode == 1 and str(engine) in out and "FAIL" in out, out
    assert host.alive(engine)
    _, procs = host.gpu("after the refused deploy")
    assert list(procs) == [engine], "the refused deploy started something on the GPU"

    t0 = time.monotonic()
    r, wall = g.fab(prof, "kill-gpu-procs", "--json")
    done = g.json_line(r)
    used, procs = host.gpu("after fab kill-gpu-procs")
    g.figure("orphan_kill_gpu_procs", {"wall_s": round(wall, 2), "freed_mib": done.get("freed_mib"),
                                       "killed": done.get("killed"), "used_after_mib": used})
    assert engine in [k["pid"] for k in done["killed"]]
    assert not procs and used <= host.baseline + g.TOLERANCE_MIB
    assert not host.vllm_procs()
    assert time.monotonic() - t0 < 60
    g.fab(prof, "stop", code=None)


def test_a_correct_drafter_is_not_broken_at_the_servers_default_temperature(host, tmp_path):
    spec = {"method": "draft_model", "model": g.MODEL, "num_speculative_tokens": 3}
    prof = g.profile(tmp_path / "self-draft.toml", "gpu-self-draft", 18313,
                     args={"enforce-eager": True, "speculative-config": spec})
    try:
        g.fab(prof, "deploy")
        r, _ = g.fab(prof, "bench", "--json", "--requests", "24", "--max-tokens", "64", code=None)
        default = g.json_line(r)
        r, _ = g.fab(prof, "bench", "--json", "--requests", "24", "--max-tokens", "64", "--temperature", "0")
        greedy = g.json_line(r)
        g.figure("self_drafter_default_temperature", {k: default.get(k) for k in ("spec", "sampling", "temperature")})
        g.figure("self_drafter_greedy", {k: greedy.get(k) for k in ("spec", "sampling", "temperature")})
        g.fab(prof, "tail-log", "--grep", "V1 model runner|Model Runner V2|drafter", code=None)
        assert greedy["spec"]["verdict"] == "healthy", json.dumps(greedy["spec"])
        assert greedy["spec"]["acceptance_rate"] > 0.9
        assert default["spec"]["verdict"] not in ("broken", "low"), json.dumps(default["spec"])
    finally:
        g.fab(prof, "stop", code=None)
