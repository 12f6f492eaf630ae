"""Start-up profile end to end: the real `fab` against a lab host with the stand-in vLLM
(which prints vLLM 0.32.0's start-up lines and keeps an AOT artifact under VLLM_CACHE_ROOT,
as tests/unit/test_standins.py checks against the real engine's recorded logs)."""
import json

import pytest

from helpers import deployment, fab, vllm_profile, Background


def last_json(r):
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.e2e
def test_a_redeploy_shares_the_cache_estimates_the_time_left_and_says_warm(lab):
    host, name = "h2", "startup-e2e"
    prof = vllm_profile(lab, name, host, 31201, {"STANDIN_LOAD_SECONDS": "1.5"})
    try:
        first = last_json(fab(lab, "deploy", "--json", profile=prof))
        phases = [p["phase"] for p in first["startup"] if p["phase"] != "unaccounted"]
        assert phases == ["process", "engine_start", "worker_start", "weights", "compile",
                          "kv_cache", "api_server", "ready"], first["startup"]
        assert first["compile_cache"] == "cold"
        total = sum(p["seconds"] for p in first["startup"])
        assert abs(total - first["ready_s"]) < 2.0, (total, first["ready_s"])
        # the redeploy of the unchanged profile: the progress line says how long is left
        run = Background(lab, "deploy", profile=prof)
        try:
            run.wait_line("s left")
            assert run.finish(120) == 0, run.text
        finally:
            run.close()
        assert "compile cache warm" in run.text, run.text
        listing = last_json(fab(lab, "releases", "--json", profile=prof))["releases"]
        assert [r["compile_cache"] for r in listing] == ["cold", "warm"]
        assert all(r["ready_s"] > 0 and r["startup"] for r in listing), listing
        human = fab(lab, "releases", profile=prof).stdout
        assert "ready in" in human and "(warm)" in human, human
        st = last_json(fab(lab, "status", "--json", profile=prof))
        assert st["compile_cache"] == "warm" and st["startup"] == listing[-1]["startup"]
        # both releases gave the engine the same environment but LLMFAB_RELEASE, and the
        # cache directory is the deployment's, named after the engine version
        envs = [json.loads((deployment(lab, host, name) / "releases" / r["release"] /
                            "standin-received.json").read_text())["env"] for r in listing]
        differ = {k for k in set(envs[0]) | set(envs[1]) if envs[0].get(k) != envs[1].get(k)}
        # (sshd's per-connection SSH_CLIENT / SSH_CONNECTION come from the host, not llmfab;
        # vLLM hashes only its own VLLM_* variables into its compile cache's key)
        assert differ - {"SSH_CLIENT", "SSH_CONNECTION"} == {"LLMFAB_RELEASE"}, differ
        from tasks.startup.estimate import in_vllm_compile_key
        assert not [k for k in differ if in_vllm_compile_key(k)]
        assert envs[0]["VLLM_CACHE_ROOT"].endswith(f"/llmfab/{name}/cache/vllm-0.33.0")  # host's view
        # a rollback relaunches the first release: its start is recorded too, warm this time
        back = last_json(fab(lab, "rollback", "--json", profile=prof))
        assert back["compile_cache"] == "warm" and back["startup"][-1]["phase"] == "ready", back
        assert (deployment(lab, host, name) / "cache" / "vllm-0.33.0" / "torch_compile_cache").is_dir()
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)


@pytest.mark.e2e
def test_a_slower_phase_is_a_warn(lab):
    host, name = "h3", "startup-slower"
    slow = deployment(lab, host, name).parent / "startup-slower-weights"
    prof = vllm_profile(lab, name, host, 31202, {"STANDIN_LOAD_SECONDS": "0.5",
                                                  "STANDIN_SLOW_WEIGHTS_FILE": str(slow)})
    try:
        first = last_json(fab(lab, "deploy", "--json", profile=prof))
        assert not [f for f in first["findings"] if f["rule"] == "startup-phase-slower"]
        slow.write_text("6\n")  # the same profile; loading the weights takes 6 s more
        r = fab(lab, "deploy", "--json", profile=prof)
        warn = [f for f in last_json(r)["findings"] if f["rule"] == "startup-phase-slower"]
        assert [f["phase"] for f in warn] == ["weights"], warn
        assert warn[0]["severity"] == "WARN" and warn[0]["seconds"] > warn[0]["previous_seconds"] + 5
        assert f"WARN startup-phase-slower start-up phase weights took {warn[0]['seconds']:.1f} s, " \
               f"{warn[0]['previous_seconds']:.1f} s at the last good start" in r.stderr, r.stderr
    finally:
        slow.unlink(missing_ok=True)
        fab(lab, "stop", "--grace", "5", profile=prof)
