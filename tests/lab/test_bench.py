"""End to end: `fab bench` and `fab status` over real SSH against the stand-in servers.

Host h1 of the session's lab (tests/conftest.py); the stand-in vLLM drafts 15 tokens per step and accepts 62 % of them
(STANDIN_ACCEPT_RATE=0.62), deterministically: any window's acceptance is 0.62 within
2 / drafted tokens. The server is loaded before the bench, so its counters are non-zero
when the bench's window opens; the bench must report the window alone.
"""
import json

import pytest

from tasks.measure import metrics

pytestmark = pytest.mark.e2e

ACCEPT = 0.62
K = 15


def _profile(lab, name, port, engine="vllm", spec=True):
    model = lab.model_dir("target")
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"', "[server]", f'engine = "{engine}"',
             f'python = "{lab.ml_python}"', f'model = "{model}"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"']
    if spec and engine == "vllm":
        lines.append(f'speculative-config = {{ method = "eagle3", model = "{lab.model_dir("drafter")}", '
                     f"num_speculative_tokens = {K} }}")
    elif spec:
        lines += ['speculative-algorithm = "EAGLE3"',
                  f'speculative-draft-model-path = "{lab.model_dir("drafter")}"',
                  "speculative-num-steps = 3", "speculative-eagle-topk = 1",
                  "speculative-num-draft-tokens = 4"]
    lines += ["[server.env]", f'STANDIN_ACCEPT_RATE = "{ACCEPT}"', 'STANDIN_TOKENS_PER_S = "3000"',
              "[ready]", "timeout = 60"]
    path = lab.root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _deployed(lab, name, port, **kw):
    prof = _profile(lab, name, port, **kw)
    r = lab.fab("deploy", profile=prof)
    assert r.returncode == 0, r.stdout + r.stderr
    return prof


@pytest.fixture(scope="module")
def spec_profile(lab):
    prof = _deployed(lab, "bench-spec", 18701)
    yield prof
    lab.fab("stop", "--grace", "5", profile=prof)


@pytest.fixture(scope="module")
def plain_profile(lab):
    prof = _deployed(lab, "bench-plain", 18702, spec=False)
    yield prof
    lab.fab("stop", "--grace", "5", profile=prof)


def _host_metrics(lab, port):
    """The server's /metrics as read on the host itself."""
    code = f"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
    r = lab.exec("h1", [str(lab.ml_python), "-c", code], capture_output=True, text=True, check=True)
    return metrics.parse(r.stdout)


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_bench_reports_acceptance_over_its_window_only(lab, spec_profile, tmp_path):
    warm = lab.fab("bench", "--requests", "6", "--max-tokens", "200", profile=spec_profile)
    assert warm.returncode == 0, warm.stderr
    before = _host_metrics(lab, 18701)
    assert before.get(metrics.DRAFTS) > 0 and before.get(metrics.ACCEPTED) > 0

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "one two three"}\n'
                       '{"messages": [{"role": "user", "content": "hello"}]}\n')
    r = lab.fab("bench", "--json", "--requests", "16", "--concurrency", "4", "--max-tokens", "96",
                "--prompts", prompts, profile=spec_profile)
    assert r.returncode == 0, r.stderr
    [rec] = _json_lines(r.stdout)
    assert list(rec) == ["host", "ok", "requests", "errors", "duration_s", "requests_per_s",
                         "output_tokens_per_s", "ttft_ms", "itl_ms", "spec", "tpot_ms", "server_ms",
                         "sampling", "concurrency", "max_tokens", "temperature", "ignore_eos",
                         "random_input_len", "seed", "prompts", "release"]
    assert rec["sampling"]["source"] == "server default", rec  # no --temperature sent
    # what the run was asked, for `--compare` (tasks/bench.py SETTINGS)
    assert (rec["concurrency"], rec["max_tokens"], rec["temperature"], rec["prompts"]) == (4, 96, None, str(prompts))
    assert rec["release"] and not rec["ignore_eos"], rec
    assert 0 < rec["tpot_ms"]["p50"] <= rec["tpot_ms"]["p90"]
    # The stand-in's /metrics has vLLM's TTFT histogram but not its TPOT one.
    assert rec["server_ms"]["ttft_mean"] > 0 and rec["server_ms"]["tpot_mean"] is None
    assert rec["host"] == "h1" and rec["requests"] == 16 and rec["errors"] == 0
    assert rec["output_tokens_per_s"] == pytest.approx(16 * 96 / rec["duration_s"], rel=0.02)
    assert 0 < rec["ttft_ms"]["p50"] <= rec["ttft_ms"]["p90"]
    assert 0 < rec["itl_ms"]["p50"] <= rec["itl_ms"]["p90"]
    spec = rec["spec"]
    assert spec["acceptance_rate"] == pytest.approx(ACCEPT, abs=0.01)
    # Every step drafts K tokens: mean acceptance length = 1 + K * acceptance rate.
    assert spec["mean_acceptance_length"] == pytest.approx(1 + K * spec["acceptance_rate"], abs=1e-3)
    assert len(spec["per_position"]) == K
    assert sum(spec["per_position"]) == pytest.approx(spec["mean_acceptance_length"] - 1, abs=1e-3)
    assert "speculative decoding: acceptance 62.0%" in r.stderr
    (tmp_path / "dflash.json").write_text(r.stdout)

    st = lab.fab("status", "--json", profile=spec_profile)
    assert st.returncode == 0, st.stderr
    [srec] = _json_lines(st.stdout)
    assert srec["spec"]["acceptance_rate"] == pytest.approx(ACCEPT, abs=0.01)
    assert isinstance(srec["generation_tokens_per_s"], float)
    assert "speculative decoding: acceptance 62.0%" in st.stderr and "(since start)" in st.stderr


def test_server_without_speculative_decoding_says_so(lab, plain_profile, spec_profile, tmp_path):
    r = lab.fab("bench", "--json", "--requests", "4", "--max-tokens", "16", profile=plain_profile)
    assert r.returncode == 0, r.stderr
    [rec] = _json_lines(r.stdout)
    assert rec["spec"] is None and rec["errors"] == 0
    assert "no speculative decoding" in r.stderr
    st = lab.fab("status", "--json", profile=plain_profile)
    assert st.returncode == 0, st.stderr
    assert _json_lines(st.stdout)[0]["spec"] is None
    assert "no speculative decoding" in st.stderr

    spec = lab.fab("bench", "--json", "--requests", "4", "--max-tokens", "16", profile=spec_profile)
    (tmp_path / "mtp.json").write_text(r.stdout)
    (tmp_path / "dflash.json").write_text(spec.stdout)
    cmp = lab.fab("bench", "--compare", f"{tmp_path / 'mtp.json'},{tmp_path / 'dflash.json'}")
    assert cmp.returncode == 0, cmp.stderr
    rows = {line.split("  ")[0].strip(): line.split() for line in cmp.stdout.splitlines()}
    assert rows["metric"] == ["metric", "mtp", "dflash", "B/A"]
    assert rows["acceptance"][1:3] == ["no", "spec"]
    assert float(rows["acceptance"][3]) == pytest.approx(ACCEPT, abs=0.02)  # a short window
    assert "output tok/s" in rows and "TTFT p90 ms" in rows


def test_sglang_acceptance_length_from_server_info(lab):
    prof = _deployed(lab, "bench-sgl", 18703, engine="sglang")
    try:
        r = lab.fab("bench", "--json", "--requests", "4", "--max-tokens", "32", profile=prof)
        assert r.returncode == 0, r.stderr
        spec = _json_lines(r.stdout)[0]["spec"]
        # 4 draft tokens per step with top-k 1: 3 drafted, 62 % accepted.
        assert spec["mean_acceptance_length"] == pytest.approx(1 + 3 * ACCEPT, abs=0.05)
        assert "(as SGLang reports it)" in r.stderr
        st = lab.fab("status", "--json", profile=prof)
        assert st.returncode == 0, st.stderr
        srec = _json_lines(st.stdout)[0]
        assert srec["spec"]["mean_acceptance_length"] == pytest.approx(1 + 3 * ACCEPT, abs=0.05)
        assert "mean acceptance length 2.8" in st.stderr
    finally:
        lab.fab("stop", "--grace", "5", profile=prof)


def test_bench_of_a_stopped_server_fails_saying_so(lab):
    prof = _profile(lab, "bench-never", 18704)
    r = lab.fab("bench", profile=prof)
    assert r.returncode == 1
    assert "the server is not running" in r.stdout and "fab deploy" in r.stdout


def test_underscore_spellings_of_name_and_key_reach_readiness_bench_and_status(lab):
    # Issue 22: `served_model_name` (vLLM takes either spelling) was not seen by readiness,
    # which waited for the model path as the name until its timeout; `api_key` left the
    # readiness check (/v1/models is guarded by the key), bench and status without the key.
    path = lab.root / "bench-key.toml"
    path.write_text("\n".join([
        "[target]", 'hosts = ["h1"]', 'name = "bench-key"', "[server]", 'engine = "vllm"',
        f'python = "{lab.ml_python}"', f'model = "{lab.model_dir("target")}"', "port = 18705",
        'host = "127.0.0.1"', "[server.args]", 'served_model_name = "under"', 'api_key = "k3y-22"',
        "[ready]", "timeout = 20", "poll_interval = 0.2", ""]))
    try:
        r = lab.fab("deploy", profile=path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "[h1] ready in" in r.stdout and ": under on port 18705" in r.stdout
        b = lab.fab("bench", "--json", "--requests", "2", "--max-tokens", "8", profile=path)
        assert b.returncode == 0, b.stdout + b.stderr
        assert _json_lines(b.stdout)[0]["errors"] == 0
        st = lab.fab("status", "--json", profile=path)
        assert st.returncode == 0 and _json_lines(st.stdout)[0]["served_name"] == "under", st.stderr
        assert "k3y-22" not in r.stdout + r.stderr + b.stdout + b.stderr + st.stdout + st.stderr
    finally:
        lab.fab("stop", "--grace", "5", profile=path)
