"""vLLM's own start-up checks of the model against the flags (stand-in), in vLLM 0.33's words.

Like the real engine, they read the model's config.json (its `text_config` when it has
one, as vLLM's `get_text_config()` does) and fail with the real texts and exit status:

- max_model_len above the model's `max_position_embeddings` (vllm/config/model.py
  get_and_verify_max_len: a pydantic ValidationError for ModelConfig in the API server);
- attention heads not divisible by tensor_parallel_size (vllm/config/model.py
  verify_with_parallel_config: a ValidationError for VllmConfig);
- KV cache too small for one max_model_len request (vllm/v1/core/kv_cache_utils.py
  _check_enough_kv_cache_memory, in the EngineCore) -- only when STANDIN_KV_CACHE_GIB
  (GiB left for the KV cache after the weights) is set, since there is no real memory here.

Each check is a function of its own; `api` / `engine` are the Server's api_traceback
and engine_init_failed (which print, then exit 1).
"""
import json
import os

GIB = 1 << 30
BLOCK = 16  # vLLM's default block size: the estimate is a multiple of it


def text_config(model):
    try:
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    return cfg.get("text_config") or cfg


def _frames(here):
    return [(os.path.join(here, "engine/arg_utils.py"), 1320, "create_engine_config",
             "vllm_config = VllmConfig(")]


def check_max_model_len(args, cfg, api, here):
    derived = cfg.get("max_position_embeddings")
    if args.max_model_len is None or derived is None or args.max_model_len <= derived:
        return
    api(_frames(here),
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (%d) is greater than the derived max_model_len "
        "(%s=%s or model_max_length=%s in model's config.json). To allow overriding this maximum, set "
        "the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
        "extreme caution. If the model uses relative position encoding (RoPE), positions exceeding "
        "derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
        "exceeding derived_max_model_len will cause a CUDA array out-of-bounds error. "
        "[type=value_error, input_value=ArgsKwargs((), {'model': %r}), input_type=ArgsKwargs]"
        % (args.max_model_len, "max_position_embeddings", derived, cfg.get("model_max_length"),
           args.model))


def check_heads(args, cfg, api, here):
    heads = cfg.get("num_attention_heads")
    if not heads or heads % args.tensor_parallel_size == 0:
        return
    api(_frames(here),
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
        "  Value error, Total number of attention heads (%d) must be divisible by tensor parallel "
        "size (%d). [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]"
        % (heads, args.tensor_parallel_size))


def check_kv_cache(args, cfg, engine):
    avail = os.environ.get("STANDIN_KV_CACHE_GIB")
    if not avail:
        return
    available = float(avail) * GIB
    heads = cfg.get("num_attention_heads") or 32
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") or 4096) // heads
    per_token = 2 * (cfg.get("num_hidden_layers") or 32) * (cfg.get("num_key_value_heads") or heads) \
        * head_dim * 2  # K and V, bf16
    max_len = args.max_model_len or cfg.get("max_position_embeddings") or 40960
    needed = -(-max_len // BLOCK) * BLOCK * per_token
    if needed <= available:
        return
    estimated = int(available // (BLOCK * per_token)) * BLOCK
    msg = ("Based on the available memory, the estimated maximum model length is %d. " % estimated
           if estimated > 0 else "")
    engine("ValueError: To serve at least one request with the model's max seq len (%d), (%.2f GiB KV "
           "cache is needed, which is larger than the available KV cache memory (%.2f GiB). %sTry "
           "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
           "engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more "
           "details." % (max_len, needed / GIB, available / GIB, msg))
