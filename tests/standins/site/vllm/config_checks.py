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

- a model that is neither a directory nor a valid Hub id (huggingface_hub's validate_repo_id,
  whose HFValidationError transformers re-raises as OSError), and an architecture the engine
  does not have (vllm/model_executor/models/registry.py, a ValidationError for ModelConfig),
  both in vLLM 0.32.0's words as the lab's real engine printed them;
- no memory at all for the KV cache ("No available memory for the cache blocks").

Each check is a function of its own; `api` / `engine` are the Server's api_traceback
and engine_init_failed (which print, then exit 1).
"""
import json
import os

GIB = 1 << 30
BLOCK = 16  # vLLM's default block size: the estimate is a multiple of it
# A few of the architectures vLLM's model registry lists (the stand-in runs any of them).
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Qwen3MoeForCausalLM", "Qwen3_5ForConditionalGeneration", "DFlashDraftModel",
                 "EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM", "GptOssForCausalLM")
REPO_ID_FORM = ("Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'. Use "
                "`repo_type` argument if needed.")


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


def format_gib(b):
    """vllm/utils/mem_utils.py: GiB rounded to 2 places, as str() prints it ('0.0', '9.47')."""
    return "%s" % round(b / GIB, 2)


def check_model_exists(model, api, here):
    """Not a directory: the engine takes it for a Hub id; a path with two or more '/' is none."""
    if os.path.isdir(model) or model.count("/") < 2:
        return
    api([(os.path.join(here, "transformers_utils/config.py"), 634, "file_or_path_exists",
          "return file_exists(")],
        "huggingface_hub.errors.HFValidationError: " + REPO_ID_FORM % model + "\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "%s", line 578, in cached_files\n' % os.path.join(here, "transformers_utils/hub.py") +
        "    raise OSError(e) from e\nOSError: " + REPO_ID_FORM % model)


def check_architecture(model, api, here):
    """The model's first architecture, or the ModelConfig error when vLLM has none of them."""
    try:
        with open(os.path.join(model, "config.json")) as f:
            archs = json.load(f).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        archs = []
    if not archs or any(a in ARCHITECTURES for a in archs):
        return archs[0] if archs else "Qwen3ForCausalLM"
    api(_frames(here),
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Model architectures %r are not supported for now. Supported architectures: "
        "dict_keys(%r) [type=value_error, input_value=ArgsKwargs((), {'model': %r}), "
        "input_type=ArgsKwargs]" % (archs, list(ARCHITECTURES), model))


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
        % (args.max_model_len, "max_position_embeddings", float(derived), cfg.get("model_max_length"),
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


def kv_cache_bytes(args, cpu):
    """Memory for the KV cache, where something sets it: on the CPU build VLLM_CPU_KVCACHE_SPACE
    (GiB; it overrides the flag), then --kv-cache-memory-bytes, then (GPU) STANDIN_KV_CACHE_GIB."""
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if cpu and space:
        return int(space) * GIB
    if args.kv_cache_memory_bytes is not None:
        return args.kv_cache_memory_bytes
    avail = os.environ.get("STANDIN_KV_CACHE_GIB")
    return float(avail) * GIB if avail and not cpu else None


def check_kv_cache(args, cfg, engine, cpu=False):
    available = kv_cache_bytes(args, cpu)
    if available is None:
        return
    if available <= 0:
        engine("ValueError: No available memory for the cache blocks. Try increasing "
               "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
               "memory reservation on the CPU backend, despite its name). See "
               "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    heads = cfg.get("num_attention_heads") or 32
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") or 4096) // heads
    width = 4 if args.dtype in ("float32", "float") else 2
    per_token = 2 * (cfg.get("num_hidden_layers") or 32) * (cfg.get("num_key_value_heads") or heads) \
        * head_dim * width  # K and V
    max_len = args.max_model_len or cfg.get("max_position_embeddings") or 40960
    needed = -(-max_len // BLOCK) * BLOCK * per_token
    if needed <= available:
        return
    estimated = int(available // (BLOCK * per_token)) * BLOCK
    msg = ("Based on the available memory, the estimated maximum model length is %d. " % estimated
           if estimated > 0 else "")
    engine("ValueError: To serve at least one request with the model's max seq len (%d), (%s GiB KV "
           "cache is needed, which is larger than the available KV cache memory (%s GiB). %sTry "
           "increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) "
           "or decreasing `max_model_len` when initializing the engine. See "
           "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
           % (max_len, format_gib(needed), format_gib(available), msg))
