"""The engine flags of `vllm serve` (stand-in), typed the way vLLM types them.

vLLM derives argparse kwargs from its config dataclasses: bool fields become
BooleanOptionalAction (`--x` / `--no-x`), lists nargs="+", Optional[...] fields go through
`optional_type`, dicts through `parse_type(json.loads)` or `union_dict_and_str`, and the
speculative config is explicitly `optional_type(json.loads)`. The wrappers below raise the
same ArgumentTypeError text, so bad JSON fails in argparse with exit 2 and
`argument --speculative-config/-sc: Value {method: cannot be converted to <function loads at 0x...>.`
"""
import argparse
import json
import re

from vllm.utils.argparse_utils import human_readable_int


def parse_type(return_type):
    def _parse_type(val):
        try:
            return return_type(val)
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                "Value %s cannot be converted to %s." % (val, return_type)) from e
    return _parse_type


def optional_type(return_type):
    def _optional_type(val):
        if val == "" or val == "None":
            return None
        return parse_type(return_type)(val)
    return _optional_type


def union_dict_and_str(val):
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return optional_type(json.loads)(val)


def parse_dataclass(cls_name):
    """Config dataclasses are validated with pydantic's TypeAdapter(cls).validate_json."""
    def _parse(val):
        try:
            value = json.loads(val)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(
                "1 validation error for %s\n  Invalid JSON: %s [type=json_invalid, "
                "input_value=%r, input_type=str]\n    For further information visit "
                "https://errors.pydantic.dev/2.12/v/json_invalid" % (cls_name, e.msg.lower(), val)
            ) from e
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(
                "1 validation error for %s\n  Input should be an object [type=dataclass_type, "
                "input_value=%r, input_type=%s]" % (cls_name, value, type(value).__name__))
        return value
    return _parse


BOOL = argparse.BooleanOptionalAction


def add_cli_args(parser):
    """Add the engine flags (a representative subset of vLLM 0.33's) to `parser`."""
    model = parser.add_argument_group("ModelConfig")
    model.add_argument("--model", type=str, default="Qwen/Qwen3-0.6B")
    model.add_argument("--served-model-name", type=str, nargs="+", default=None)
    model.add_argument("--tokenizer", type=optional_type(str), default=None)
    model.add_argument("--trust-remote-code", action=BOOL, default=False)
    model.add_argument("--dtype", default="auto",
                       choices=["auto", "bfloat16", "float", "float16", "float32", "half"])
    model.add_argument("--seed", type=optional_type(int), default=None)
    model.add_argument("--max-model-len", type=optional_type(human_readable_int), default=None)
    model.add_argument("--quantization", "-q", type=optional_type(str), default=None)
    model.add_argument("--enforce-eager", action=BOOL, default=False)
    model.add_argument("--enable-sleep-mode", action=BOOL, default=False)
    model.add_argument("--max-logprobs", type=int, default=20)
    model.add_argument("--revision", type=optional_type(str), default=None)
    model.add_argument("--hf-overrides", type=union_dict_and_str, default={})
    model.add_argument("--generation-config", type=str, default="auto")
    model.add_argument("--override-generation-config", type=optional_type(json.loads), default={})
    model.add_argument("--language-model-only", action=BOOL, default=False)
    model.add_argument("--limit-mm-per-prompt", type=parse_type(json.loads), default={})
    model.add_argument("--mm-processor-kwargs", type=optional_type(json.loads), default=None)
    model.add_argument("--download-dir", type=optional_type(str), default=None)
    model.add_argument("--load-format", type=str, default="auto")

    parallel = parser.add_argument_group("ParallelConfig")
    parallel.add_argument("--distributed-executor-backend", type=optional_type(str), default=None,
                          choices=["external_launcher", "mp", "ray", "uni", None, "None"])
    parallel.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parallel.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parallel.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parallel.add_argument("--enable-expert-parallel", action=BOOL, default=False)
    parallel.add_argument("--nnodes", type=int, default=1)
    parallel.add_argument("--node-rank", type=int, default=0)
    parallel.add_argument("--master-addr", type=str, default="127.0.0.1")
    parallel.add_argument("--master-port", type=int, default=29501)
    parallel.add_argument("--disable-custom-all-reduce", action=BOOL, default=False)

    cache = parser.add_argument_group("CacheConfig")
    cache.add_argument("--block-size", type=optional_type(int), default=None)
    cache.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    cache.add_argument("--kv-cache-memory-bytes", type=optional_type(human_readable_int), default=None)
    cache.add_argument("--swap-space", type=float, default=4)
    cache.add_argument("--kv-cache-dtype", type=str, default="auto")
    cache.add_argument("--enable-prefix-caching", action=BOOL, default=None)
    cache.add_argument("--cpu-offload-gb", type=float, default=0)

    sched = parser.add_argument_group("SchedulerConfig")
    sched.add_argument("--max-num-batched-tokens", type=optional_type(human_readable_int), default=None)
    sched.add_argument("--max-num-seqs", type=optional_type(int), default=None)
    sched.add_argument("--enable-chunked-prefill", action=BOOL, default=None)
    sched.add_argument("--async-scheduling", action=BOOL, default=None)

    compilation = parser.add_argument_group("CompilationConfig")
    compilation.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", default=None)
    compilation.add_argument("--max-cudagraph-capture-size", type=optional_type(int), default=None)

    vllm_group = parser.add_argument_group("VllmConfig")
    vllm_group.add_argument("--speculative-config", "-sc", type=optional_type(json.loads), default=None)
    vllm_group.add_argument("--kv-transfer-config", type=parse_dataclass("KVTransferConfig"), default=None)
    vllm_group.add_argument("--compilation-config", "-cc", type=parse_dataclass("CompilationConfig"),
                            default={})
    vllm_group.add_argument("--additional-config", type=parse_type(json.loads), default={})
    vllm_group.add_argument("--optimization-level", type=str, default="2")

    parser.add_argument("--disable-log-stats", action="store_true", help="Disable logging statistics.")
    parser.add_argument("--enable-log-requests", action=BOOL, default=False)
    return parser


def add_frontend_args(parser):
    """The OpenAI server's own flags (vllm/entrypoints/openai/cli_args.py)."""
    parser.add_argument("--host", type=optional_type(str), default=None)
    parser.add_argument("--port", type=parser.check_port, default=8000)
    parser.add_argument("--uds", type=optional_type(str), default=None)
    parser.add_argument("--uvicorn-log-level", type=str, default="info",
                        choices=["critical", "debug", "error", "info", "trace", "warning"])
    parser.add_argument("--disable-uvicorn-access-log", action=BOOL, default=False)
    parser.add_argument("--api-key", type=optional_type(str), nargs="+", default=None)
    parser.add_argument("--chat-template", type=optional_type(str), default=None)
    parser.add_argument("--enable-auto-tool-choice", action=BOOL, default=False)
    parser.add_argument("--tool-call-parser", type=optional_type(str), default=None)
    parser.add_argument("--reasoning-parser", type=str, default="")
    parser.add_argument("--root-path", type=optional_type(str), default=None)
    parser.add_argument("--headless", action="store_true", default=False)
    parser.add_argument("--api-server-count", "-asc", type=optional_type(int), default=None)
    return parser
