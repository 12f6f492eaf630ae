"""Failure rules in the engines' own words: vLLM and SGLang start-up failures.

Each pattern names the engine version(s) and file its wording was read in (the
vLLM/SGLang repositories on GitHub, read with the search tools; several wordings
are kept where one changed across versions). Priorities: 80-90 a precise root
cause, 60-79 a generic one, below 20 a wrapper that only points at the cause.
"""
from ..host.records import ABOVE, BELOW, Pattern, Rule

NUM = r"[\d,]+"     # vLLM prints plain ints; a comma-grouped figure is read too

RULES = (
    Rule(
        "max-model-len-too-long", "context longer than the model allows", 84,
        "max-model-len {asked} is more than the model's {derived_key} ({derived_int})",
        "set `max-model-len = {derived_int}` in [server.args] (or, if the model really takes "
        "longer inputs, e.g. with rope scaling, [server.env] VLLM_ALLOW_LONG_MAX_MODEL_LEN = \"1\")",
        (Pattern(r"User-specified max_model_len \((?P<asked>\d+)\) is greater than the derived "
                 r"max_model_len \((?P<derived_key>[\w.]+)=(?P<derived>\d+(?:\.\d+)?)",
                 "vLLM 0.2-0.3 vllm/config.py _get_and_verify_max_len ('(KEY=N in model's config.json)'); "
                 "0.4-0.10 vllm/config.py and >= 0.11 vllm/config/model.py ('(KEY=N or model_max_length=M "
                 "in model's config.json)', pydantic 'Value error, ...' in 0.10+); seen in vLLM 0.32.0 "
                 "(CPU build), which prints N as a float ('max_position_embeddings=1024.0')"),)),
    Rule(
        "kv-cache-too-small", "KV cache too small for max-model-len", 84,
        "one request of {max_len} tokens needs {need_gib} GiB of KV cache; only {avail_gib} GiB is left "
        "after the weights",
        "set `max-model-len = {estimated_int}` in [server.args] (the most that fits), or "
        "{kv_memory_more}",
        (Pattern(r"To serve at least one request with the models?'s? max seq len \((?P<max_len>\d+)\), "
                 r"\((?P<need_gib>[\d.]+) GiB KV cache is needed, which is larger than the available "
                 r"KV cache memory \((?P<avail_gib>[\d.]+) GiB\)\. Based on the available memory, the "
                 r"estimated maximum model length is (?P<estimated>" + NUM + r")",
                 "vLLM 0.8-0.22 vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory "
                 "(\"models's\" in 0.8-0.11, \"model's\" later), 0.33 v1/core/kv_cache_planning.py; seen in "
                 "vLLM 0.32.0 (CPU build) with an explicit KV cache size (kv-cache-memory-bytes)"),
         Pattern(r"The model's max seq len \((?P<max_len>\d+)\) is larger than the maximum number of "
                 r"tokens that can be stored in KV cache \((?P<estimated>" + NUM + r")\)",
                 "vLLM 0.1x-0.7 vllm/worker/worker.py raise_if_cache_size_invalid (no GiB figures)"))),
    Rule(
        "no-kv-cache-memory", "no memory left for the KV cache", 83,
        "the weights (and activations) filled the memory the engine may use; nothing is left for "
        "the KV cache",
        "{no_kv_fix}",
        (Pattern(r"No available memory for the cache blocks",
                 "vLLM 0.4-0.33 vllm/v1/core/kv_cache_utils.py (earlier vllm/worker/worker.py); seen in "
                 "vLLM 0.32.0 (CPU build) with VLLM_CPU_KVCACHE_SPACE=0"),
         Pattern(r"Not enough memory\. Please try to increase --mem-fraction-static\.?"
                 r"(?: Current value: mem_fraction_static=(?P<mem_fraction>[\d.]+))?",
                 "SGLang 0.3-0.4 srt/model_executor/model_runner.py; 0.5 srt/mem_cache/pool_configurator.py "
                 "(adds 'Current value: mem_fraction_static=X')",
                 fix="raise `mem-fraction-static` in [server.args] (now {mem_fraction}; try {mem_fraction_next})"))),
    Rule(
        "gpu-memory-taken", "another process holds the GPU", 84,
        "GPU {device} has only {free} of {total} GiB free; gpu-memory-utilization {util} wants {want} GiB "
        "({holders})",
        "{free_it}; or lower `gpu-memory-utilization` to {util_fit} (what is free now)",
        (Pattern(r"Free memory on device(?: (?P<device>[\w:]+))? \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) "
                 r"on startup is less than desired GPU memory utilization \((?P<util>[\d.]+), "
                 r"(?P<want>[\d.]+) GiB\)",
                 "vLLM 0.8-0.10 vllm/v1/worker/gpu_worker.py ('Free memory on device (F/T GiB)'); "
                 ">= 0.11 vllm/v1/worker/utils.py ('on device cuda:N (F/T GiB)')"),)),
    Rule(
        "model-load-oom", "weights do not fit in GPU memory", 82,
        "the model's weights do not fit in the GPU memory left to them ({original})",
        "use more GPUs (`tensor-parallel-size`, now {tp}), a quantized model (`quantization`), or free "
        "the GPU of other processes (`{fab_dry}`)",
        (Pattern(r"Failed to load model - not enough GPU memory\.(?:.*\(original error: (?P<original>[^)]*))?",
                 "vLLM 0.11-0.33 vllm/v1/worker/gpu_model_runner.py load_model (logger.error, then the "
                 "torch OOM is re-raised)"),)),
    Rule(
        "tp-heads-divisible", "tensor-parallel-size does not divide the heads", 84,
        "the model has {heads} attention heads, which {tp} GPUs cannot share evenly",
        "set `tensor-parallel-size = {tp_fit}` in [server.args] (the largest divisor of {heads} "
        "up to {tp})",
        (Pattern(r"Total number of attention heads \((?P<heads>\d+)\) must be divisible by tensor "
                 r"parallel size \((?P<tp>\d+)\)",
                 "vLLM 0.2-0.33 vllm/config.py, then vllm/config/model.py verify_with_parallel_config "
                 "(a pydantic 'Value error, ...' for VllmConfig in 0.10+)"),)),
    Rule(
        "not-enough-gpus", "more GPUs asked for than the host shows", 84,
        "the engine needs {world} GPUs (tensor-parallel-size x pipeline-parallel-size) and sees {gpus} "
        "on this host",
        "set `tensor-parallel-size` (and `pipeline-parallel-size`) in [server.args] so that their "
        "product is at most {gpus}, or make more GPUs visible to it ([gpu] devices, "
        "CUDA_VISIBLE_DEVICES); across several hosts use a [cluster] profile",
        (Pattern(r"World size \((?P<world>\d+)\) is larger than the number of available GPUs "
                 r"\((?P<gpus>\d+)\)",
                 "vLLM 0.1x-0.26 vllm/config/parallel.py ParallelConfig (a pydantic 'Value error, ...'); "
                 "seen in vLLM 0.26.0 on an H200 with tensor-parallel-size 3 on one GPU"),)),
    Rule(
        "bf16-unsupported", "GPU cannot run bfloat16", 84,
        "the {gpu} GPU ({cc}) has no bfloat16; the model asks for it",
        "set `dtype = \"half\"` in [server.args]",
        (Pattern(r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0\. "
                 r"Your (?P<gpu>.+?) GPU (?P<cc>has compute capability [\d.]+|does not have a compute "
                 r"capability)",
                 "vLLM 0.2-0.6 vllm/worker/worker.py _check_if_gpu_supports_dtype; later "
                 "vllm/platforms (same text, '--dtype=half' hint from 0.4)"),)),
    Rule(
        "unsupported-architecture", "model architecture not in this engine", 84,
        "this engine version cannot run the model's architecture {archs}",
        "upgrade the engine on the host to a version that lists {archs}, or check `architectures` "
        "in the model's config.json",
        (Pattern(r"Model architectures (?P<archs>\[[^\]]*\]) are not supported for now",
                 "vLLM 0.1-0.33 vllm/model_executor/models/registry.py _raise_for_unsupported "
                 "(earlier vllm/model_executor/model_loader.py); seen in vLLM 0.32.0 (CPU build), as "
                 "a pydantic 'Value error, ...' for ModelConfig"),
         Pattern(r"Model architectures (?P<archs>\[[^\]]*\]) failed to be inspected",
                 "vLLM 0.8-0.33 vllm/model_executor/models/registry.py (import of the model file failed)",
                 fix="the engine failed to import its model code for {archs}: look at the lines above it "
                     "(a missing dependency, or a build that does not match the host)"),
         Pattern(r"model type [`']?(?P<archs>[\w.-]+)[`']? but Transformers does not recognize this "
                 r"architecture",
                 "transformers 4.3x-4.5x models/auto/configuration_auto.py (the type in backticks; "
                 "quoted or bare as vLLM and SGLang re-raise it)",
                 fix="upgrade transformers on the host (it does not know model type {archs}), or check "
                     "`model_type` in the model's config.json"))),
    Rule(
        "unsupported-spec-method", "speculative method unknown to this vLLM", 86,
        "this vLLM does not know the speculative method {method}",
        "use a method this version lists ({allowed}), or upgrade vLLM on the host",
        (Pattern(r"Unsupported speculative method:? '(?P<method>[^']*)'",
                 "vLLM 0.9-0.33 vllm/config/speculative.py (earlier vllm/config.py) SpeculativeConfig "
                 "(\"method: '...'\"; also read without the colon, as the pydantic Value error)"),
         Pattern(r"Unknown speculative algorithm name: (?P<method>\S+)",
                 "SGLang 0.4-0.5.20 srt/speculative/spec_info.py SpeculativeAlgorithm.from_string",
                 fix="set `speculative-algorithm` to one this SGLang knows (0.5: EAGLE, EAGLE3, NEXTN, "
                     "STANDALONE, NGRAM, DFLASH; case does not matter), or upgrade SGLang on the host"),
         Pattern(r"Input should be (?P<allowed>'.+?') \[type=literal_error, input_value='(?P<method>[^']*)'",
                 "vLLM 0.19.x pydantic Literal of SpeculativeConfig.method",
                 after=r"method$|validation error for SpeculativeConfig"))),
    Rule(
        "dflash-swa-refused", "DFlash drafter's sliding layers refused", 88,
        "this vLLM refuses a DFlash drafter that mixes sliding-window and full attention layers",
        "upgrade vLLM to >= 0.26 and set [server.env] VLLM_USE_V2_MODEL_RUNNER = \"1\", or use a "
        "drafter whose `layer_types` are all full attention",
        (Pattern(r"DFlash does not yet support mixed sliding/full attention via layer_types",
                 "vLLM 0.25.x vllm/model_executor/models/qwen3_dflash.py _resolve_layer_attention"),)),
    Rule(
        "dflash-swa-needs-v2", "DFlash sliding layers need the V2 runner", 88,
        "a DFlash drafter with mixed sliding/full attention runs only on vLLM's V2 model runner",
        "set [server.env] VLLM_USE_V2_MODEL_RUNNER = \"1\"",
        (Pattern(r"DFlash drafters with mixed sliding/full attention require the V2 model runner",
                 "vLLM >= 0.26 vllm/model_executor/models/qwen3_dflash.py _resolve_layer_attention"),)),
    Rule(
        "flashinfer-missing", "FlashInfer is not installed", 86,
        "the engine imports FlashInfer (vLLM's CUDA build requires it: its top-k/top-p sampler uses "
        "it unless told not to) and the server's environment has no `flashinfer` module",
        "set [server.env] VLLM_USE_FLASHINFER_SAMPLER = \"0\" (vLLM then samples without it), or "
        "install flashinfer-python built for this vLLM and torch into the server's environment",
        (Pattern(r"ModuleNotFoundError: No module named 'flashinfer'",
                 "vLLM 0.26.0 vllm/v1/sample/ops/topk_topp_sampler.py flashinfer_sampler_supported "
                 "(imports vllm/v1/attention/backends/flashinfer.py unless VLLM_USE_FLASHINFER_SAMPLER "
                 "is 0; flashinfer is in requirements/cuda.txt); seen in vLLM 0.26.0 on an H200"),)),
    Rule(
        "engine-metadata-missing", "engine build cannot read its own version", 86,
        "the engine's entry point asked importlib.metadata for the distribution `{dist}`, which is not "
        "installed under that name (a build of it installed as another distribution, e.g. vllm-cpu)",
        "start it through `python -m vllm.entrypoints.openai.api_server --model MODEL ...`, which does "
        "not ask: with `engine = \"vllm\"` llmfab does this for such builds (`fab check` names the "
        "build); in a `command` server, replace `vllm serve MODEL` or `-m vllm.entrypoints.cli.main "
        "serve MODEL` with it",
        (Pattern(r"PackageNotFoundError: No package metadata was found for (?P<dist>vllm)\b",
                 "vLLM 0.32.0 (CPU build) vllm/entrypoints/cli/main.py (importlib.metadata.version(\"vllm\") "
                 "for a distribution named vllm-cpu); seen in vLLM 0.32.0 (CPU build)"),)),
    Rule(
        "worker-died", "engine worker killed by a signal", 66,
        "the engine's worker process {worker} was killed by {signal_name}{signal_meaning}",
        "{worker_fix}",
        (Pattern(r"Worker proc (?P<worker>\S+) died unexpectedly \(exit code: (?P<code>-\d+)\)",
                 "vLLM 0.9-0.33 vllm/v1/executor/multiproc_executor.py monitor_workers (a negative exit "
                 "code is a signal; 0 or 1 follows another error and says nothing); seen in vLLM 0.32.0 "
                 "(CPU build): -4 on the first request with the default bfloat16"),)),
    Rule(
        "engine-init-failed", "engine start failed (wrapper)", 12,
        "the engine failed to start: {inner}",
        "read the engine's lines above it (shown below); `{fab_tail}` shows the whole log",
        (Pattern(r"Engine core initialization failed",
                 "vLLM 0.8-0.33 vllm/v1/engine/utils.py wait_for_engine_startup (earlier core_client.py)"),
         Pattern(r"Received sigquit from a child process\. It usually means the child failed",
                 "SGLang 0.4-0.5 srt/entrypoints/engine.py sigquit_handler")),
        wrapper=ABOVE),
    Rule(
        "engine-dead", "engine died", 10,
        "the engine process died: {inner}",
        "read the engine's traceback (shown below); if it keeps happening, report it with `{fab_tail}`'s "
        "output to the engine's issue tracker",
        # Log order decides among these (the first line that matches is the evidence): when
        # the EngineCore process is killed (kill -9, the OOM killer), the API server's monitor
        # says so first, then an EngineDeadError traceback follows as on any shutdown.
        (Pattern(r"\[shutdown\] MPClient: engine core exited unexpectedly",
                 "vLLM 0.32 vllm/v1/engine/core_client.py MPClient.start_engine_core_monitor "
                 "(logger.warning_once); seen in vLLM 0.32.0 (CPU build): its EngineCore killed with "
                 "SIGKILL"),
         Pattern(r"EngineCore encountered a fatal error",
                 "vLLM 0.8-0.33 vllm/v1/engine/core.py run_engine_core (logger.exception: the traceback follows)"),
         Pattern(r"EngineDeadError",
                 "vLLM 0.8-0.33 vllm/v1/engine/exceptions.py ('EngineCore encountered an issue. See stack "
                 "trace (above) for the root cause.')")),
        wrapper=BELOW),
)
