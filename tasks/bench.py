"""`fab bench`: load the running server from the host itself and report what it delivers.

Flags are checked first (exit 2, no host touched): --requests (32), --concurrency (4) and
--max-tokens (128) must be positive integers; --prompts is a JSONL file read here, one
`{"prompt": "..."}` (-> /v1/completions) or `{"messages": [...]}` (-> /v1/chat/completions)
per line; without it the shipped prompt set (tasks/measure/workload.py: text a drafter can
predict in part) in the order `--seed` gives (default 0). `--random-input-len N` sends
instead prompts of N random token ids drawn from the model's tokenizer.json on the host
(as `vllm bench serve --dataset-name random` does), `--ignore-eos` makes every request
generate --max-tokens tokens: with both, a workload `vllm bench serve` can repeat
(benchmarks/vllm_bench_compare.py). The agent then runs one warm-up
request (not measured) and the measured requests against 127.0.0.1:port, streaming, and
snapshots /metrics right before and after the window, so the speculative-decoding numbers
are counter deltas over the bench alone. `--compare A.json,B.json` prints two saved
`--json` results side by side and touches no host.
"""
import json
from pathlib import Path

from .doctor.sampling import PROBE_REQUESTS, window_sampling
from .measure import bench_stats, metrics, workload
from .fleet.runner import load, run_task
from .errors import ExitCode, OperationFailed, UsageError
from .fleet.fanout import HostResult
from .output import indented

# After the window the agent's counters may trail the last streamed token by a moment.
COUNTER_SETTLE_S = 2.0


def read_prompts(path):
    """[{"prompt": str} | {"messages": [...]}] from a JSONL file; UsageError naming file:line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--prompts: cannot read {path}: {getattr(e, 'strerror', None) or e}") \
            from None
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--prompts: {path}:{n}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise UsageError(f"{where}: not JSON ({e})") from None
        if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            items.append({"prompt": obj["prompt"]})
        elif isinstance(obj, dict) and isinstance(obj.get("messages"), list) and obj["messages"] \
                and all(isinstance(m, dict) and "role" in m for m in obj["messages"]):
            items.append({"messages": obj["messages"]})
        else:
            raise UsageError(f'{where}: expected {{"prompt": "text"}} or '
                             f'{{"messages": [{{"role": ..., "content": ...}}, ...]}}')
    if not items:
        raise UsageError(f"--prompts: {path} holds no prompt")
    return items


# What a bench run was asked to do, in its --json record: runs compare only when these agree.
SETTINGS = ("concurrency", "max_tokens", "temperature", "ignore_eos", "random_input_len", "seed",
            "prompts", "release")


def settings(opts, release):
    """The SETTINGS of this run (`temperature` None: the server's default sampling)."""
    values = {k: getattr(opts, k, None) for k in SETTINGS if k != "release"}
    values["ignore_eos"] = bool(values["ignore_eos"])
    values["prompts"] = str(values["prompts"]) if values["prompts"] else None
    return dict(values, release=release)


def compare(paths):
    """`--compare A.json,B.json`: the two saved runs side by side, with a warning naming each
    setting in which they differ (a run saved before settings were recorded: not known)."""
    columns = bench_stats.read_runs(paths[0]) + bench_stats.read_runs(paths[1])
    headers, rows = bench_stats.compare_table(columns)
    from .output import Reporter
    rep = Reporter()
    differ = [k for k in SETTINGS if k != "release" and len({repr(r.get(k)) for _, r in columns}) > 1]
    if differ:
        rep.line(None, "warning: these runs were not made alike: " + "; ".join(
            f"{k} " + " vs ".join(f"{'not recorded' if k not in r else r[k]} ({label})" for label, r in columns)
            for k in differ))
    rep.table(headers, rows)
    if len(columns) == 2:  # A/B that decides (tasks/measure/repeats.py)
        from .measure.repeats import verdict_line
        (la, a), (lb, b) = columns
        rep.line(None, verdict_line(la, a, lb, b))


def _settle(host, profile, port, raw, tokens):
    """Re-read /metrics until vLLM's generation counter covers the tokens received."""
    import time
    if profile.server.engine == "sglang" or not raw["before"].get("text") \
            or not raw["after"].get("text"):
        return
    deadline = time.monotonic() + COUNTER_SETTLE_S
    before = metrics.parse(raw["before"]["text"]).get(metrics.GENERATED)
    while before is not None:
        after = metrics.parse(raw["after"]["text"]).get(metrics.GENERATED)
        if after is None or after - before >= tokens or time.monotonic() > deadline:
            return
        time.sleep(0.1)
        res = host.call("metrics", port=port, host=profile.server.host, engine="vllm")
        raw["after"] = res["samples"][0]


def measure_once(host, profile, reporter, port, prompts, window, server, ddir):
    """One measured bench window: (result record, the agent's raw answer). `window`: requests,
    concurrency, max_tokens, and optionally `sampling` (extra request fields, e.g.
    temperature). `fab tune` measures each variant with this too."""
    engine = profile.server.engine
    raw = host.call("bench", port=port, host=profile.server.host, engine=engine,
                    model=profile.served_name, models_path=profile.ready.models_path,
                    api_key=profile.api_key, prompts=prompts, **window)
    tokens = sum(s["output_tokens"] for s in raw["samples"] if s["ok"])
    _settle(host, profile, port, raw, tokens)
    try:
        spec = bench_stats.window_spec(raw, engine)
    except ValueError as e:
        reporter.line(host.name, f"/metrics unreadable: {e}")
        spec = None
    rec = bench_stats.record(host.name, raw, spec)
    # the request's sampling; the server's default is known from the doctor's answer below
    rec["sampling"] = window_sampling(window.get("sampling"), {"temperature": None, "source": "server default"})
    if rec["spec"] is not None:  # the doctor's verdict over this window (tasks/doctor/findings.py)
        from .doctor.findings import bench_verdict

        def probe():  # a short greedy run, only when the rule table needs greedy evidence
            greedy = dict(window, requests=PROBE_REQUESTS,
                          sampling=dict(window.get("sampling") or {}, temperature=0))
            p_raw = host.call("bench", port=port, host=profile.server.host, engine=engine,
                              model=profile.served_name, models_path=profile.ready.models_path,
                              api_key=profile.api_key, prompts=prompts, **greedy)
            _settle(host, profile, port, p_raw,
                    sum(s["output_tokens"] for s in p_raw["samples"] if s["ok"]))
            try:
                return bench_stats.window_spec(p_raw, engine), PROBE_REQUESTS
            except ValueError:
                return None, PROBE_REQUESTS

        text, more, rec["sampling"] = bench_verdict(host, profile, ddir, server.get("release"), raw,
                                                    spec, rec["spec"], window.get("sampling"),
                                                    probe if engine == "vllm" else None)
        rec["_verdict_lines"] = (text, more)
    return rec, raw


def bench(c, opts):
    """Body of `fab bench` (opts: tasks.options.BenchOptions)."""
    if opts.compare:
        return compare(opts.compare)
    window = {"requests": opts.requests, "concurrency": opts.concurrency, "max_tokens": opts.max_tokens}
    if opts.temperature is not None:
        window["sampling"] = {"temperature": opts.temperature}
    if opts.ignore_eos:
        window.setdefault("sampling", {})["ignore_eos"] = True
    prompts = read_prompts(opts.prompts) if opts.prompts \
        else workload.prompts(seed=opts.seed, count=opts.requests + 1)
    profile = load(c, opts.profile)
    if opts.random_input_len:
        window.update(random_input_len=opts.random_input_len, model_dir=profile.server.model,
                   seed=opts.seed)
        prompts = None
    json_mode = opts.json
    from .steps.preflight import deploy_dir
    ddir = deploy_dir(profile)
    engine = profile.server.engine

    def op(host, reporter):
        host.start()
        st = host.call("state", deploy_dir=ddir)
        server = st.get("server") or {}
        if not st["alive"]:
            raise OperationFailed(f"the server is not running ({ddir} on {host.name}): "
                                  "start it with `fab deploy`, see `fab status`")
        port = server.get("port") or profile.server.port
        reporter.line(host.name, f"bench: {window['requests']} requests (+1 warm-up), concurrency "
                                 f"{window['concurrency']}, max_tokens {window['max_tokens']}, port {port}"
                                 + (f", {opts.random_input_len} random input tokens"
                                    if opts.random_input_len else "")
                                 + (", ignore_eos" if opts.ignore_eos else "")
                                 + (f", {opts.repeat} runs" if opts.repeat > 1 else ""))
        runs = []
        for n in range(opts.repeat):
            rec, raw = measure_once(host, profile, reporter, port, prompts, window, server, ddir)
            runs.append(rec)
            unreadable = raw["after"].get("error") if engine != "sglang" else None
            head = [f"run {n + 1} of {opts.repeat}"] if opts.repeat > 1 else []
            reporter.lines(host.name, [indented(t, 2) for t in head + bench_stats.human_lines(
                rec, engine, unreadable, rec.pop("_verdict_lines", None))])
            for err in bench_stats.first_errors(raw):
                reporter.line(host.name, f"  error: {err}")
        if opts.repeat > 1:
            from .measure.repeats import repeat_lines, summarize
            rec = summarize(runs)
            reporter.lines(host.name, [indented(t, 2) for t in repeat_lines(rec)])
        failed = rec["errors"] == rec["requests"]
        if json_mode:  # the settings last: `--compare` warns when two runs' differ
            reporter.emit_json(dict({"host": rec["host"], "ok": not failed}, **rec,
                                    **settings(opts, server.get("release"))))
        summary = (f"{rec['requests_per_s'] or 0:.2f} req/s, {rec['output_tokens_per_s'] or 0:.1f} "
                   f"tok/s" + (f", {rec['errors']} errors" if rec["errors"] else ""))
        return HostResult(host.name, ExitCode.FAILED if failed else 0,
                          "every request failed" if failed else summary)
    run_task(c, profile, op, opts, title="bench", json_mode=json_mode)
