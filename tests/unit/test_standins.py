"""The stand-ins behave like the real vLLM / SGLang / nvidia-smi (run locally, no SSH).

These pin down what llmfab's own tests rely on: vLLM's argparse wording and exit codes,
the received argv/env byte for byte, start-up and failure log lines, GPU memory held by a
server and by its engine child, and the /metrics arithmetic of speculative decoding.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostlab import wait_for
from standins import NVIDIA_SMI, fake_model_dir
from standins import nvidia_smi

LOADS_ERROR = re.compile(
    r"serve: error: argument --speculative-config/-sc: Value \{method: cannot be converted to "
    r"<function loads at 0x[0-9a-f]+>\.")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def host(tmp_path, standin_env):
    """A working directory (the 'release dir'), a fake GPU driver and the env's python."""
    fake = tmp_path / "fakegpu"
    nvidia_smi.write_gpus(str(fake), 2, uuid_seed=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "CUDA_"))}
    env.update(FAKEGPU_DIR=str(fake), STANDIN_LOAD_SECONDS="0.2",
               VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))  # not this machine's ~/.cache

    class Host:
        python = str(standin_env / "bin" / "python3")
        vllm_script = str(standin_env / "bin" / "vllm")
        cwd = tmp_path
        model = str(fake_model_dir(tmp_path / "model"))
        procs = []

        def __init__(self):
            self.env = env

        def smi(self, *args):
            return subprocess.run([sys.executable, str(NVIDIA_SMI)] + list(args), env=self.env,
                                  capture_output=True, text=True)

        def used(self):
            out = self.smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits").stdout
            return {int(i): int(m) for i, m in (line.split(", ") for line in out.splitlines())}

        def run(self, argv, **env):
            return subprocess.run(argv, cwd=self.cwd, env=dict(self.env, **env),
                                  capture_output=True, timeout=60)

        def start(self, argv, **env):
            env = dict(self.env, **env)
            env.setdefault("STANDIN_READY_FILE", str(tmp_path / "ready"))
            log = open(tmp_path / "server.log", "ab")
            proc = subprocess.Popen(argv, cwd=self.cwd, env=env, stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(proc)
            return proc

        def wait_ready(self, proc):
            ready = tmp_path / "ready"
            wait_for(lambda: ready.exists() or proc.poll() is not None, 30, "the stand-in")
            assert proc.poll() is None, self.log()
            return float(ready.read_text())

        def log(self):
            return (tmp_path / "server.log").read_text(errors="replace")

        def received(self):
            return json.loads((tmp_path / "standin-received.json").read_text())

    h = Host()
    yield h
    for proc in h.procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid in _registered_pids(str(fake)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _registered_pids(directory):
    return {r["host_pid"] for r in nvidia_smi.live_registrations(directory)}


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def spec_counters(port):
    _, text = get("http://127.0.0.1:%d/metrics" % port)
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name.endswith("_total"):
                key = s.name + ("[%s]" % s.labels["position"] if "position" in s.labels else "")
                out[key] = out.get(key, 0) + s.value
    return out


# -- vLLM's command line -------------------------------------------------------------------

def test_bad_json_fails_in_argparse_with_vllms_wording(host):
    r = host.run([host.python, "-m", "vllm.entrypoints.cli.main", "serve", host.model,
                  "--speculative-config", "{method:"])
    assert r.returncode == 2
    assert LOADS_ERROR.search(r.stderr.decode()), r.stderr
    # through the console script, argparse's prog is "vllm" as users see it
    r = host.run([host.vllm_script, "serve", host.model, "-sc", "{method:"])
    assert r.returncode == 2
    assert re.search(r"^vllm " + LOADS_ERROR.pattern, r.stderr.decode(), re.M), r.stderr
    assert not (host.cwd / "standin-received.json").exists()


def test_unknown_flag_and_bad_values_exit_2(host):
    r = host.run([host.vllm_script, "serve", host.model, "--no-such-flag", "1"])
    assert r.returncode == 2
    assert "vllm: error: unrecognized arguments: --no-such-flag 1" in r.stderr.decode()
    r = host.run([host.vllm_script, "serve", host.model, "--port", "80"])
    assert r.returncode == 2
    assert "argument --port: Port must be between 1024 and 65535" in r.stderr.decode()
    r = host.run([host.vllm_script, "serve", host.model, "--tensor-parallel-size", "two"])
    assert r.returncode == 2
    assert "argument --tensor-parallel-size/-tp: invalid int value: 'two'" in r.stderr.decode()


def test_valid_flags_are_recorded_with_vllm_types(host):
    port = free_port()
    spec = '{"method":"eagle3","model":"/d","num_speculative_tokens":3}'
    proc = host.start([host.python, "-m", "vllm.entrypoints.cli.main", "serve", host.model,
                       "--port", str(port), "--speculative_config", spec,
                       "--no-enable-prefix-caching", "--served-model-name", "a", "b",
                       "-tp", "2", "--max-model-len", "32k", "--trust-remote-code",
                       "--hf-overrides", '{"rope_theta": 1e6}'])
    host.wait_ready(proc)
    args = host.received()["args"]
    assert args["speculative_config"] == json.loads(spec)
    assert args["enable_prefix_caching"] is False
    assert args["served_model_name"] == ["a", "b"]
    assert args["tensor_parallel_size"] == 2
    assert args["max_model_len"] == 32000
    assert args["trust_remote_code"] is True
    assert args["hf_overrides"] == {"rope_theta": 1e6}
    assert args["model"] == host.model
    status, body = get("http://127.0.0.1:%d/v1/models" % port)
    assert [m["id"] for m in json.loads(body)["data"]] == ["a", "b"]
    log = host.log()
    order = ["non-default args", "Model loading took", "torch.compile took",
             "Available KV cache memory", "init engine", "Starting vLLM server on",
             "Application startup complete."]
    positions = [log.index(line) for line in order]
    assert positions == sorted(positions), log
    assert re.search(r"^\(EngineCore_DP0 pid=\d+\) INFO .* Model loading took", log, re.M)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert "Application shutdown complete." in host.log()


def test_boolean_optional_action_and_dotted_keys(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port),
                       "--enable_prefix_caching", "--speculative-config.method", "mtp",
                       "--speculative-config.num_speculative_tokens", "2",
                       "--disable-log-stats"])
    host.wait_ready(proc)
    args = host.received()["args"]
    assert args["enable_prefix_caching"] is True
    assert args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert args["disable_log_stats"] is True
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(20) == 0


def test_argv_and_env_survive_byte_for_byte(host):
    port = free_port()
    odd = os.fsdecode(b"model-\xff\xfe-\xc3\xa9")
    env = dict(host.env, ODD_VALUE=os.fsdecode(b"\x80raw\xffbytes"), SPACED="a b  'c' \"d\"")
    proc = subprocess.Popen([host.python, "-m", "vllm.entrypoints.cli.main", "serve", host.model,
                             "--port", str(port), "--served-model-name", odd],
                            cwd=host.cwd, env=dict(env, STANDIN_READY_FILE=str(host.cwd / "ready")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    host.procs.append(proc)
    host.wait_ready(proc)
    got = host.received()
    assert os.fsencode(got["argv"][-1]) == b"model-\xff\xfe-\xc3\xa9"
    assert os.fsencode(got["env"]["ODD_VALUE"]) == b"\x80raw\xffbytes"
    assert got["env"]["SPACED"] == "a b  'c' \"d\""
    assert got["pid"] == proc.pid and got["pgid"] == proc.pid


# -- failures, the way vLLM fails -----------------------------------------------------------

@pytest.mark.parametrize("mode, lines", [
    ("oom", ["torch.OutOfMemoryError: CUDA out of memory",
             "RuntimeError: Engine core initialization failed. See root cause above."]),
    ("engine_init", ["(EngineCore_DP0 pid=", "ERROR",
                     "RuntimeError: Engine core initialization failed. See root cause above."]),
    ("port_in_use", ["OSError: [Errno 98] Address already in use"]),
])
def test_start_up_failures_exit_1_with_the_fatal_lines(host, mode, lines):
    fatal = host.cwd / "fatal"
    r = host.run([host.vllm_script, "serve", host.model, "--port", str(free_port())],
                 STANDIN_FAIL=mode, STANDIN_FATAL_FILE=str(fatal))
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 1, out
    for line in lines:
        assert line in out
    assert fatal.exists()
    assert host.used() == {0: 4, 1: 4}  # nothing left holding memory


def test_port_held_by_another_process_fails_like_vllm(host):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        r = host.run([host.vllm_script, "serve", host.model, "--port", str(s.getsockname()[1])])
    assert r.returncode == 1
    assert "OSError: [Errno 98] Address already in use" in r.stdout.decode()


def test_port_refuses_while_loading_and_never_ready_keeps_logging(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port)],
                      STANDIN_FAIL="never_ready", STANDIN_LOAD_SECONDS="0.1")
    wait_for(lambda: host.log().count("Capturing CUDA graphs") >= 3, 20, "progress lines")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(20) == 0


def test_engine_death_after_ready_exits_0_with_engine_dead_error(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port)],
                      STANDIN_FAIL="engine_death", STANDIN_DEATH_AFTER="0.5")
    host.wait_ready(proc)
    assert get("http://127.0.0.1:%d/health" % port)[0] == 200
    assert proc.wait(20) == 0
    log = host.log()
    assert "EngineCore encountered a fatal error" in log
    assert "vllm.v1.engine.exceptions.EngineDeadError" in log
    assert host.used() == {0: 4, 1: 4}


def test_sigkill_leaves_the_engine_child_holding_memory(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port)],
                      CUDA_VISIBLE_DEVICES="1", STANDIN_GPU_MIB="2000")
    host.wait_ready(proc)
    assert host.used() == {0: 4, 1: 2004}
    apps = host.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                    "--format=csv,noheader,nounits").stdout.splitlines()
    assert len(apps) == 2 and any(", VLLM::EngineCore, 1500, GPU-" in a for a in apps), apps
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert host.used() == {0: 4, 1: 1504}  # the orphaned EngineCore still holds its share
    child = [int(a.split(", ")[0]) for a in host.smi(
        "--query-compute-apps=pid", "--format=csv,noheader").stdout.split()]
    assert len(child) == 1 and os.getpgid(child[0]) == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)
    wait_for(lambda: host.used() == {0: 4, 1: 4}, 10, "memory freed")


def test_worker_setsid_and_ignore_term(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port)],
                      STANDIN_WORKER_SETSID="1", STANDIN_IGNORE_TERM="1")
    host.wait_ready(proc)
    pids = _registered_pids(host.env["FAKEGPU_DIR"])
    child = (pids - {proc.pid}).pop()
    assert os.getpgid(child) == child != proc.pid  # left the process group
    os.killpg(proc.pid, signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(1)  # ignored: the only way to notice is that it is still there
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert host.used()[0] > 4  # the child, outside the group, still holds memory
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: host.used() == {0: 4, 1: 4}, 10, "memory freed")


def test_free_memory_check_fails_like_vllm_when_an_orphan_holds_the_gpu(host):
    port = free_port()
    first = host.start([host.vllm_script, "serve", host.model, "--port", str(port)],
                       STANDIN_GPU_MIB="40000")
    host.wait_ready(first)
    r = host.run([host.vllm_script, "serve", host.model, "--port", str(free_port())])
    out = r.stdout.decode()
    assert r.returncode == 1
    assert "is less than desired GPU memory utilization (0.9," in out
    assert "Engine core initialization failed" in out


# -- HTTP, metrics and speculative-decoding arithmetic ------------------------------------

def test_metrics_acceptance_arithmetic(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port),
                       "--speculative-config", '{"method":"dflash","num_speculative_tokens":15}'],
                      STANDIN_TOKENS_PER_S="5000")
    host.wait_ready(proc)
    base = "http://127.0.0.1:%d" % port
    post(base + "/v1/completions", {"model": host.model, "prompt": "warm up", "max_tokens": 50})
    before = spec_counters(port)
    for i in range(6):
        body = {"model": host.model, "max_tokens": 120}
        if i % 2:
            post(base + "/v1/chat/completions", dict(body, messages=[{"role": "user", "content": "hi"}]))
        else:
            post(base + "/v1/completions", dict(body, prompt="hello there"))
    after = spec_counters(port)
    for key in before:
        assert after[key] >= before[key]
    d = {k: after[k] - before[k] for k in after}
    drafts = d["vllm:spec_decode_num_drafts_total"]
    drafted = d["vllm:spec_decode_num_draft_tokens_total"]
    accepted = d["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafted == 15 * drafts
    assert abs(accepted / drafted - 0.62) <= 0.01
    per_pos = [d["vllm:spec_decode_num_accepted_tokens_per_pos_total[%d]" % i] for i in range(15)]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    # each step emits 1 + accepted tokens: generation tokens agree with the spec counters
    gen = d["vllm:generation_tokens_total"]
    assert gen == 6 * 120 and gen <= drafts + accepted
    assert 1 + accepted / drafts == pytest.approx(1 + 0.62 * 15, abs=0.2)


def test_no_spec_counters_without_speculative_config(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port)])
    host.wait_ready(proc)
    _, text = get("http://127.0.0.1:%d/metrics" % port)
    names = {f.name for f in text_string_to_metric_families(text.decode())}
    assert "vllm:generation_tokens" in names and "vllm:time_to_first_token_seconds" in names
    assert not any("spec_decode" in n for n in names)


def test_streaming_sse_with_usage(host):
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port),
                       "--served-model-name", "m"])
    host.wait_ready(proc)
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/chat/completions" % port,
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 7,
                    "stream": True, "stream_options": {"include_usage": True}}).encode(),
        {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        events = [line[6:] for line in r.read().decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["completion_tokens"] == 7 and chunks[-1]["choices"] == []
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert get("http://127.0.0.1:%d/health" % port) == (200, b"")


# -- SGLang -----------------------------------------------------------------------------------

def test_sglang_rejects_underscores_and_reports_acceptance_length(host):
    r = host.run([host.python, "-m", "sglang.launch_server", "--model_path", host.model])
    assert r.returncode == 2
    assert "error: the following arguments are required: --model-path/--model" in r.stderr.decode()
    port = free_port()
    proc = host.start([host.python, "-m", "sglang.launch_server", "--model-path", host.model,
                       "--port", str(port), "--speculative-algorithm", "EAGLE3",
                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "4", "--tp-size", "1"],
                      STANDIN_TOKENS_PER_S="5000")
    host.wait_ready(proc)
    assert "The server is fired up and ready to roll!" in host.log()
    assert get("http://127.0.0.1:%d/health" % port)[0] == 200
    info = json.loads(get("http://127.0.0.1:%d/get_model_info" % port)[1])
    assert info["model_path"] == host.model
    post("http://127.0.0.1:%d/v1/completions" % port, {"model": host.model, "prompt": "p",
                                                        "max_tokens": 200})
    state = json.loads(get("http://127.0.0.1:%d/server_info" % port)[1])["internal_states"][0]
    assert state["avg_spec_accept_length"] == pytest.approx(1 + 0.62 * 3, abs=0.1)
    assert host.received()["args"]["speculative_algorithm"] == "EAGLE3"


# -- nvidia-smi ---------------------------------------------------------------------------------

def test_nvidia_smi_formats_and_errors(host):
    r = host.smi("-L")
    assert re.fullmatch(r"(GPU \d: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)\n){2}", r.stdout)
    r = host.smi("--query-gpu=memory.total,index,name", "--format=csv")
    assert r.stdout.splitlines() == ["memory.total [MiB], index, name",
                                     "81559 MiB, 0, NVIDIA H100 80GB HBM3",
                                     "81559 MiB, 1, NVIDIA H100 80GB HBM3"]
    r = host.smi("--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
                 "--format=csv,noheader,nounits", "-i", "1")
    assert re.fullmatch(r"1, GPU-[0-9a-f-]{36}, NVIDIA H100 80GB HBM3, 4, 81559, 0\n", r.stdout)
    r = host.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv")
    assert r.stdout == "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n"
    nvidia_smi.write_gpus(host.env["FAKEGPU_DIR"], 1, fields={"utilization.gpu": "[N/A]"})
    r = host.smi("--query-gpu=index,utilization.gpu", "--format=csv")
    assert r.stdout.splitlines()[1] == "0, [N/A]"
    r = host.smi("--query-gpu=bogus", "--format=csv")
    assert r.returncode == 2 and 'Field "bogus" is not a valid field to query.' in r.stdout
    r = host.smi("--frobnicate")
    assert r.returncode == 2 and "Invalid combination of input arguments" in r.stdout
    r = subprocess.run([sys.executable, str(NVIDIA_SMI), "-L"], capture_output=True, text=True,
                       env=dict(host.env, FAKEGPU_DIR=str(host.cwd / "nothing")))
    assert r.returncode == 9 and "couldn't communicate with the NVIDIA driver" in r.stdout


# -- the demo server ------------------------------------------------------------------------------

def test_demo_server_runs_on_plain_python(host):
    port = free_port()
    demo = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "configs", "demo_server.py")
    proc = host.start(["/usr/bin/python3", demo, "--port", str(port), "--load-seconds", "0.2",
                       "--served-model-name", "demo-model", "--num-speculative-tokens", "4"])

    def up():
        try:
            return get("http://127.0.0.1:%d/health" % port)[0] == 200
        except OSError:
            assert proc.poll() is None, host.log()
            return False
    wait_for(up, 20, "the demo server")
    models = json.loads(get("http://127.0.0.1:%d/v1/models" % port)[1])
    assert models["data"][0]["id"] == "demo-model"
    out = post("http://127.0.0.1:%d/v1/completions" % port,
               {"model": "demo-model", "prompt": "x", "max_tokens": 40})
    assert out["usage"]["completion_tokens"] == 40
    assert spec_counters(port)["vllm:spec_decode_num_drafts_total"] > 0
    log = host.log()
    assert "DEMO server" in log and "Application startup complete." in log
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_start_up_lines_parse_like_the_real_vllm(host):
    """The stand-in's start-up log gives the phases the real vLLM 0.32.0's gives
    (tests/fixtures/startup/, recorded): eager, then compile mode cold and warm."""
    from pathlib import Path
    from tasks.startup.host import phases
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "startup"

    def parsed(text):
        p = phases.Parser("vllm", 0.0)
        p.feed(text)
        return [x["phase"] for x in phases.phases(p, 1e12) if x["phase"] != "unaccounted"], p.cache

    def standin(*flags, **env):
        port = free_port()
        (host.cwd / "server.log").write_bytes(b"")
        (host.cwd / "ready").unlink(missing_ok=True)
        proc = host.start([host.python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                           host.model, "--port", str(port), *flags], **env)
        host.wait_ready(proc)
        wait_for(lambda: "Application startup complete." in host.log(), 10, "uvicorn's line")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        return host.log()

    cache = str(host.cwd / "vllm-cache")
    real = {n: (fixtures / f"vllm-0.32.0-cpu-api_server-{n}.log").read_text()
            for n in ("enforce-eager", "compile-cold", "compile-warm")}
    assert parsed(standin("--enforce-eager")) == parsed(real["enforce-eager"])
    got, real_cold = parsed(standin(VLLM_CACHE_ROOT=cache)), parsed(real["compile-cold"])
    assert got[1] == real_cold[1] == "cold"
    assert [p for p in got[0] if p != "compile"] == [p for p in real_cold[0] if p != "compile"]
    assert "compile" in got[0] and "compile" in real_cold[0]
    assert parsed(standin(VLLM_CACHE_ROOT=cache))[1] == parsed(real["compile-warm"])[1] == "warm"
