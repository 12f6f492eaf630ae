"""`python -m sglang.launch_server --model-path M --port P ...` (SGLang stand-in).

Like SGLang 0.5: plain argparse (underscore spellings are unknown flags, unique prefixes
are accepted), logs `[2026-01-01 00:00:00 TP0] ...`, opens its port while still warming up
(/health answers 503 until then), then prints `The server is fired up and ready to roll!`.
Serves /health, /health_generate, /get_model_info, /v1/models, /server_info
(/get_server_info) with `internal_states[0].avg_spec_accept_length` when speculative,
/metrics with --enable-metrics, and the OpenAI endpoints. Knobs: llmfab_standin.engine.
"""
import argparse
import os
import sys
import time

import sglang
from llmfab_standin import demo_server as http
from llmfab_standin.engine import (EngineChild, GpuHold, Knobs, Lifecycle, jsonable,
                                   new_engine, stamp_file, visible_gpus, write_received)

HERE = os.path.dirname(os.path.abspath(sglang.__file__))


def build_parser():
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", "--model", type=str, required=True)
    p.add_argument("--tokenizer-path", type=str, default=None)
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", type=str, default=None)
    p.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "--pp-size", type=int, default=1)
    p.add_argument("--data-parallel-size", "--dp-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--dtype", type=str, default="auto",
                   choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--quantization", type=str, default=None)
    p.add_argument("--kv-cache-dtype", type=str, default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--api-key", type=str, default=None)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--log-level", type=str, default="info")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--enable-torch-compile", action="store_true")
    p.add_argument("--attention-backend", type=str, default=None)
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--speculative-algorithm", type=str, default=None)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", type=str,
                   default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", type=str, default=None)
    return p


def _log(text, tp=None):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    http.raw("[%s%s] %s" % (stamp, " TP%d" % tp if tp is not None else "", text))


def _traceback(final, frames):
    text = "Traceback (most recent call last):\n"
    for path, lineno, func, code in frames:
        text += '  File "%s", line %d, in %s\n    %s\n' % (path, lineno, func, code)
    for line in (text + final).splitlines():
        http.raw(line)


def main(argv=None):
    args = build_parser().parse_args(argv)
    write_received(jsonable(args))
    knobs = Knobs()
    life = Lifecycle(knobs)
    served = args.served_model_name or args.model_path
    algo = (args.speculative_algorithm or "").upper() or None
    _log("server_args=ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in vars(args).items()))
    if algo is not None and algo not in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "DFLASH",
                                         "NGRAM"):
        _traceback("ValueError: Unknown speculative algorithm name: %s"
                   % args.speculative_algorithm,
                   [(os.path.join(HERE, "srt/server_args.py"), 612, "__post_init__",
                     "self._handle_speculative_decoding()")])
        stamp_file(knobs.fatal_file)
        return 1
    try:
        if knobs.fail == "port_in_use":
            raise OSError(98, "Address already in use")
        sock = http.bind_socket(args.host, args.port)
    except OSError as exc:
        if exc.errno != 98:
            raise
        _traceback("OSError: [Errno 98] Address already in use",
                   [(os.path.join(HERE, "srt/entrypoints/http_server.py"), 1266, "launch_server",
                     "uvicorn.run(")])
        stamp_file(knobs.fatal_file)
        return 1
    gpus = visible_gpus()
    if not gpus:
        _traceback("RuntimeError: No CUDA GPUs are available",
                   [(os.path.join(HERE, "srt/managers/scheduler.py"), 2710,
                     "run_scheduler_process", "scheduler = Scheduler(")])
        stamp_file(knobs.fatal_file)
        return 1
    used = gpus[:args.tensor_parallel_size * args.pipeline_parallel_size]
    server_share = knobs.gpu_mib // 4
    hold = GpuHold(used, server_share)
    child = EngineChild("sglang::scheduler_TP0", used, knobs.gpu_mib - server_share, knobs)

    def stop(code):
        child.stop()
        hold.release()
        return code

    def wait(share):
        return life.sleep(knobs.load_seconds * share)

    def scheduler_failed(cause):
        _log("Scheduler hit an exception: Traceback (most recent call last):", tp=0)
        _traceback(cause, [(os.path.join(HERE, "srt/managers/scheduler.py"), 2720,
                            "run_scheduler_process", "scheduler = Scheduler(")])
        stamp_file(knobs.fatal_file)
        _log("Received sigquit from a child process. It usually means the child failed.")
        return stop(1)

    _log("Load weight begin. avail mem=78.50 GB", tp=0)
    if wait(0.5):
        return stop(0)
    _log("Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=63.38 GB, "
         "mem usage=%.2f GB." % (knobs.gpu_mib / 1024.0), tp=0)
    if knobs.fail == "oom":
        return scheduler_failed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
                                "1.13 GiB is free.")
    if knobs.fail == "engine_init":
        # SGLang 0.5 srt/mem_cache/pool_configurator.py MemoryPoolConfig.__post_init__
        # names the value it had, when one was given.
        current = ("" if args.mem_fraction_static is None else
                   " Current value: mem_fraction_static=%s" % args.mem_fraction_static)
        return scheduler_failed("RuntimeError: Not enough memory. Please try to increase "
                                "--mem-fraction-static." + current)
    _log("KV Cache is allocated. #tokens: 400000, K size: 24.41 GB, V size: 24.41 GB", tp=0)
    _log("Capture cuda graph begin. This can take up to several minutes. avail mem=13.87 GB",
         tp=0)
    if knobs.fail == "never_ready":
        n = 0
        while not life.sleep(0.5):
            n += 1
            _log("Capture cuda graph bs %d ... (%d/36)" % (n, n % 36), tp=0)
        return stop(0)
    if wait(0.2):
        return stop(0)
    _log("Capture cuda graph end. Time elapsed: %.2f s. mem usage=0.20 GB. avail mem=13.67 GB."
         % (0.2 * knobs.load_seconds), tp=0)
    _log("max_total_num_tokens=400000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
         "max_running_requests=4096, context_len=%d, available_gpu_mem=13.67 GB"
         % (args.context_length or 40960), tp=0)

    spec_k = 0
    if algo:
        spec_k = ((args.speculative_num_draft_tokens or 0) - 1 if args.speculative_num_draft_tokens
                  else args.speculative_num_steps or 3)
        spec_k = max(1, spec_k)
    engine = new_engine([served], knobs, spec_k, prefix="sglang")

    def server_info(state):
        info = {k: v for k, v in vars(args).items()}
        info.update({"version": sglang.__version__, "dp_size": args.data_parallel_size,
                     "speculative_algorithm": algo})
        internal = {"last_gen_throughput": knobs.tokens_per_s,
                    "memory_usage": {"weight": knobs.gpu_mib / 1024.0}}
        if engine.spec is not None:
            internal["avg_spec_accept_length"] = engine.spec.mean_acceptance_length() or 1.0
        info["internal_states"] = [internal]
        return 200, info

    def model_info(state):
        return 200, {"model_path": args.model_path,
                     "tokenizer_path": args.tokenizer_path or args.model_path,
                     "is_generation": True, "preferred_sampling_params": None,
                     "weight_version": "default", "has_image_understanding": False,
                     "has_audio_understanding": False, "model_type": "qwen3",
                     "architectures": ["Qwen3ForCausalLM"]}

    def health_generate(state):
        return (200 if state.healthy else 503), b""

    routes = {"/server_info": server_info, "/get_server_info": server_info,
              "/get_model_info": model_info, "/health_generate": health_generate}
    state = http.ServerState(engine, [served], api_key=args.api_key, version=sglang.__version__,
                             routes=routes)
    if not args.enable_metrics:
        # Without --enable-metrics SGLang has no /metrics route.
        state.routes["/metrics"] = lambda s: (404, {"detail": "Not Found"})
    state.healthy = False
    server = http.start_http(state, sock)
    http.raw("[%s] INFO:     Started server process [%d]" % (time.strftime("%Y-%m-%d %H:%M:%S"), os.getpid()))
    http.raw("[%s] INFO:     Waiting for application startup." % time.strftime("%Y-%m-%d %H:%M:%S"))
    http.raw("[%s] INFO:     Application startup complete." % time.strftime("%Y-%m-%d %H:%M:%S"))
    http.raw("[%s] INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)"
             % (time.strftime("%Y-%m-%d %H:%M:%S"), args.host, args.port))
    if wait(0.2):
        server.shutdown()
        return stop(0)
    state.healthy = True
    stamp_file(knobs.ready_file)
    _log("The server is fired up and ready to roll!")
    death_at = time.monotonic() + knobs.death_after if knobs.fail == "engine_death" else None
    while not life.sleep(0.1):
        dead = not child.alive()
        if death_at is not None and time.monotonic() >= death_at:
            _log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory "
                 "access was encountered", tp=0)
            stamp_file(knobs.fatal_file)
            child.kill()
            dead = True
        if dead:
            state.healthy = False
            _log("Received sigquit from a child process. It usually means the child failed.")
            life.sleep(0.5)
            break
    server.shutdown()
    return stop(0)


if __name__ == "__main__":
    sys.exit(main())
