#!/usr/bin/env python3
"""DEMO OpenAI-compatible server for llmfab: no GPU, no model, made-up tokens.

`configs/demo.toml` deploys this file so `fab deploy` shows the whole flow on a laptop:
it logs vLLM-like startup phases (loading, compiling, warming, `Application startup
complete.`), keeps its port closed while "loading" (like vLLM), then serves

    GET  /health                200, empty body (503 once the engine is dead)
    GET  /v1/models             the served model name(s)
    GET  /metrics               Prometheus text, vLLM's metric names, with simulated
                                speculative-decoding counters
    POST /v1/completions        OpenAI completions, `stream: true` too (SSE)
    POST /v1/chat/completions   OpenAI chat completions, `stream: true` too

It is also a library: llmfab's test stand-ins for vLLM and SGLang (tests/standins/) import
it for their HTTP side, so there is one implementation of the OpenAI/metrics behaviour.

Standard library only; runs on any Python 3.9 or newer.
"""
import argparse
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = [
    "SpecDecodeSim", "Metrics", "Engine", "ServerState", "log", "bind_socket",
    "start_http", "main",
]

# Histogram buckets vLLM uses for time-to-first-token.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)

WORDS = ("the", "quick", "model", "serves", "tokens", "over", "a", "lazy", "GPU",
         "while", "drafts", "get", "accepted", "and", "latency", "drops")

_log_lock = threading.Lock()


def log(message, *, level="INFO", where="demo_server.py:1", prefix=""):
    """Print one vLLM-style log line (`INFO 11-30 04:27:01 [file.py:12] text`), flushed.

    `prefix` is e.g. `(APIServer pid=12) ` as recent vLLM versions put before each line.
    """
    stamp = time.strftime("%m-%d %H:%M:%S")
    line = "%s%s %s [%s] %s" % (prefix, level, stamp, where, message)
    with _log_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def raw(line):
    """Print a line as is (tracebacks, uvicorn's `INFO:     ...` lines), flushed."""
    with _log_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------------------
# Speculative decoding, simulated deterministically


class SpecDecodeSim:
    """Counts what a speculative decoder would: drafts, draft tokens, accepted tokens.

    Every step drafts `k` tokens and accepts round(rate * k) of them, with the rounding
    error carried to the next step, so after any number of steps
    accepted == round(rate * draft_tokens): the acceptance rate measured over a window of
    W draft tokens is `rate` within 2/W. Accepted tokens are always a prefix of the draft,
    so per-position counts fall with the position, like a real drafter's.

    `geometric=True`: position i is accepted in a share rate ** (i + 1) of the steps (each
    position accepted with probability `rate` given the one before, as real drafters
    behave: acceptance falls with the position), again exactly, with the rounding carried.
    Then a larger k yields less per drafted token, and with a cost per drafted token
    (Engine `draft_cost`) some k is fastest.
    """

    def __init__(self, k, rate, geometric=False):
        if k < 1:
            raise ValueError("num_speculative_tokens must be >= 1, got %r" % (k,))
        self.k = int(k)
        self.rate = min(1.0, max(0.0, float(rate)))
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.per_pos = [0] * self.k
        self.geometric = bool(geometric)
        self._lock = threading.Lock()

    def step(self):
        """One verification step; returns how many drafted tokens were accepted."""
        with self._lock:
            self.drafts += 1
            self.draft_tokens += self.k
            if self.geometric:
                accepted = 0
                while accepted < self.k and self.per_pos[accepted] < int(math.floor(
                        self.rate ** (accepted + 1) * self.drafts + 0.5)):
                    self.per_pos[accepted] += 1
                    accepted += 1
                self.accepted += accepted
                return accepted
            target = int(math.floor(self.rate * self.draft_tokens + 0.5))
            accepted = min(self.k, max(0, target - self.accepted))
            self.accepted += accepted
            for i in range(accepted):
                self.per_pos[i] += 1
            return accepted

    def snapshot(self):
        with self._lock:
            return {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                    "accepted": self.accepted, "per_pos": list(self.per_pos)}

    def mean_acceptance_length(self):
        snap = self.snapshot()
        return 1.0 + snap["accepted"] / snap["drafts"] if snap["drafts"] else None


# ---------------------------------------------------------------------------------------
# Prometheus text exposition (format 0.0.4, as prometheus_client writes it)


def _num(value):
    """Format a sample value the way prometheus_client does (Go-style floats)."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and "e" not in text and dot > 6:
        digits = (text[:dot] + text[dot + 1:]).rstrip("0")
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return "%se+%02d" % (mantissa, dot - 1)
    return text


def _labels(pairs):
    def esc(v):
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    # prometheus_client writes labels sorted by name
    return "{" + ",".join('%s="%s"' % (k, esc(v)) for k, v in sorted(pairs)) + "}"


class Metrics:
    """vLLM's metric names, rendered like prometheus_client's `generate_latest`.

    `prefix` is "vllm" for vLLM-like servers; labels are model_name and engine.
    Counters only grow.
    """

    def __init__(self, model_name, *, spec=None, prefix="vllm"):
        self.model_name = model_name
        self.spec = spec
        self.prefix = prefix
        self.created = time.time()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.request_success = 0
        self.running = 0
        self.waiting = 0
        self.ttft_buckets = [0] * len(TTFT_BUCKETS)
        self.ttft_count = 0
        self.ttft_sum = 0.0
        self._lock = threading.Lock()

    def add(self, *, prompt=0, generated=0, finished=0, running=0):
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated
            self.request_success += finished
            self.running += running

    def observe_ttft(self, seconds):
        with self._lock:
            self.ttft_count += 1
            self.ttft_sum += seconds
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self.ttft_buckets[i] += 1

    def render(self):
        p = self.prefix
        base = (("model_name", self.model_name), ("engine", "0"))
        out = []

        def family(name, kind, doc, samples, created=None):
            """One metric family; `created` labels -> its `_created` gauge family after it,
            where prometheus_client puts the OpenMetrics-only samples."""
            out.append("# HELP %s %s" % (name, doc))
            out.append("# TYPE %s %s" % (name, kind))
            for sample_name, labels, value in samples:
                out.append("%s%s %s" % (sample_name, _labels(labels), _num(value)))
            if created:
                stem = name[:-len("_total")] if kind == "counter" else name
                out.append("# HELP %s_created %s" % (stem, doc))
                out.append("# TYPE %s_created gauge" % stem)
                for labels in created:
                    out.append("%s_created%s %s" % (stem, _labels(labels), _num(self.created)))

        def counter(name, doc, values):
            """values: [(labels, value)]"""
            family(name + "_total", "counter", doc,
                   [(name + "_total", labels, v) for labels, v in values],
                   created=[labels for labels, _ in values])

        with self._lock:
            family(p + ":num_requests_running", "gauge",
                   "Number of requests in model execution batches.",
                   [(p + ":num_requests_running", base, self.running)])
            family(p + ":num_requests_waiting", "gauge",
                   "Number of requests waiting to be processed.",
                   [(p + ":num_requests_waiting", base, self.waiting)])
            family(p + ":kv_cache_usage_perc", "gauge",
                   "KV-cache usage. 1 means 100 percent usage.",
                   [(p + ":kv_cache_usage_perc", base, min(1.0, 0.013 * self.running))])
            counter(p + ":prompt_tokens", "Number of prefill tokens processed.",
                    [(base, self.prompt_tokens)])
            counter(p + ":generation_tokens", "Number of generation tokens processed.",
                    [(base, self.generation_tokens)])
            counter(p + ":request_success", "Count of successfully processed requests.",
                    [(base + (("finished_reason", "length"),), self.request_success)])
            name = p + ":time_to_first_token_seconds"
            samples = [(name + "_bucket", base + (("le", _num(b)),), n)
                       for b, n in zip(TTFT_BUCKETS, self.ttft_buckets)]
            samples.append((name + "_bucket", base + (("le", "+Inf"),), self.ttft_count))
            samples.append((name + "_count", base, self.ttft_count))
            samples.append((name + "_sum", base, self.ttft_sum))
            family(name, "histogram", "Histogram of time to first token in seconds.", samples,
                   created=[base])
        if self.spec is not None:
            s = self.spec.snapshot()
            counter(p + ":spec_decode_num_drafts", "Number of spec decoding drafts.",
                    [(base, s["drafts"])])
            counter(p + ":spec_decode_num_draft_tokens", "Number of draft tokens.",
                    [(base, s["draft_tokens"])])
            counter(p + ":spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                    [(base, s["accepted"])])
            counter(p + ":spec_decode_num_accepted_tokens_per_pos",
                    "Accepted tokens per draft position.",
                    [(base + (("position", str(pos)),), n) for pos, n in enumerate(s["per_pos"])])
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Token generation


class Engine:
    """Makes up tokens at `tokens_per_s` per request; drives the metrics and the spec sim."""

    def __init__(self, metrics, *, tokens_per_s=200.0, spec=None, draft_cost=None, batch_cost=None):
        self.metrics = metrics
        self.tokens_per_s = max(0.001, float(tokens_per_s))
        self.spec = spec
        # None: each token takes 1/tokens_per_s, drafted or not. A number: a step is one
        # target pass (1/tokens_per_s) plus `draft_cost` of one per drafted token, and
        # yields 1 + accepted tokens, so speculative settings change the speed.
        self.draft_cost = draft_cost
        # None: a request's speed does not depend on the others. A number b: each other
        # request running adds b x (1 + k) of a target pass to every step (a batch verifies
        # every request's k drafted tokens plus one), so latency grows with the load and
        # speculation that wins alone loses under load. TPOT at concurrency c is then
        # (1 + d k + b (c - 1)(1 + k)) / (tokens_per_s x tokens per step): known in advance.
        self.batch_cost = batch_cost
        self.running = 0
        self._word = 0
        self.weights_lost = False
        self._lock = threading.Lock()

    def _words(self, n, at=None):
        """n words: the next in the server's running sequence, or from word `at` (a greedy
        request: the same prompt gives the same text, as temperature 0 does on a real engine).
        With the weights gone (sleep level 2 then a wake) the text is empty, as vLLM's is."""
        if self.weights_lost:
            return ""
        if at is None:
            with self._lock:
                at = self._word
                self._word += n
        return "".join(" " + WORDS[(at + i) % len(WORDS)] for i in range(n))

    def generate(self, prompt_tokens, max_tokens, greedy_key=None):
        """Yield chunks of text, one per decoding step; the first after a short prefill."""
        self.metrics.add(prompt=prompt_tokens, running=1)
        with self._lock:
            self.running += 1
        started = time.monotonic()
        first = True
        remaining = max(0, int(max_tokens))
        at = None if greedy_key is None else sum(greedy_key.encode("utf-8", "replace")) % len(WORDS)
        try:
            time.sleep(0.002 + prompt_tokens / 50000.0)  # prefill
            while remaining > 0:
                step = 1 + (self.spec.step() if self.spec is not None else 0)
                n = min(step, remaining)
                k = self.spec.k if self.spec is not None else 0
                load = self.batch_cost * (self.running - 1) * (1 + k) if self.batch_cost else 0.0
                if self.draft_cost is None:
                    time.sleep(n / self.tokens_per_s + load / self.tokens_per_s)
                else:
                    time.sleep((1.0 + self.draft_cost * k + load) / self.tokens_per_s)
                remaining -= n
                self.metrics.add(generated=n)
                if first:
                    self.metrics.observe_ttft(time.monotonic() - started)
                    first = False
                yield self._words(n, at), n
                if at is not None:
                    at += n
            self.metrics.add(finished=1)
        finally:
            with self._lock:
                self.running -= 1
            self.metrics.add(running=-1)


def count_prompt_tokens(body):
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages") or []
                        if isinstance(m, dict))
    else:
        prompt = body.get("prompt", "")
        text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    return max(1, len(text.split()))


# ---------------------------------------------------------------------------------------
# HTTP


class ServerState:
    """What the HTTP handler serves. `routes` adds engine-specific GET endpoints:
    {path: callable(state) -> (status, json-able body)}."""

    def __init__(self, engine, served_names, *, api_key=None, version="demo",
                 routes=None, access_log=True, log_prefix=""):
        self.engine = engine
        self.served_names = list(served_names)
        self.api_key = api_key
        self.version = version
        self.routes = dict(routes or {})
        # POST endpoints beyond the completions: {path: callable(state, query) -> (status, body)}
        self.post_routes = {}
        # Cleared while the engine sleeps (vLLM's sleep mode): a completion waits, unanswered.
        self.awake = threading.Event()
        self.awake.set()
        self.access_log = access_log
        self.log_prefix = log_prefix
        self.healthy = True          # False: /health answers 503 (engine dead / starting)
        self.created = int(time.time())

    def models_body(self):
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "vllm",
             "root": self.served_names[0], "parent": None, "max_model_len": 32768,
             "permission": []}
            for name in self.served_names]}


def _make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *args):  # replaced by uvicorn-like access lines
            pass

        def _access(self, code):
            if state.access_log:
                raw('%sINFO:     %s:%d - "%s %s HTTP/1.1" %d %s' % (
                    state.log_prefix, self.client_address[0], self.client_address[1],
                    self.command, self.path, code, _reason(code)))

        def _send(self, code, body=b"", ctype="application/json"):
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self._access(code)

        def _error(self, code, message, etype):
            self._send(code, {"object": "error", "message": message, "type": etype,
                              "param": None, "code": code})

        def _authorized(self):
            if not state.api_key:
                return True
            if self.headers.get("Authorization", "") == "Bearer " + state.api_key:
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                return self._send(200 if state.healthy else 503, b"")
            if path == "/metrics":
                return self._send(200, state.engine.metrics.render(),
                                  "text/plain; version=0.0.4; charset=utf-8")
            if path == "/version":
                return self._send(200, {"version": state.version})
            if path == "/v1/models":
                if self._authorized():
                    self._send(200, state.models_body())
                return None
            if path in state.routes:
                code, body = state.routes[path](state)
                return self._send(code, body)
            return self._send(404, {"detail": "Not Found"})

        do_HEAD = do_GET

        def _body(self):
            """The request body, by Content-Length or chunked (as uvicorn reads it: HAProxy's
            Lua httpclient, among others, sends chunked)."""
            if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()  # the CRLF after the chunk
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else b""

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            data = self._body()
            if path in state.post_routes:
                query = self.path.split("?", 1)[1] if "?" in self.path else ""
                code, body = state.post_routes[path](state, query)
                return self._send(code, body)
            if path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, {"detail": "Not Found"})
            if not self._authorized():
                return None
            try:
                body = json.loads(data or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("body must be a JSON object")
            except ValueError as exc:
                return self._error(400, "Invalid JSON body: %s" % exc, "BadRequestError")
            model = body.get("model", state.served_names[0])
            if model not in state.served_names:
                return self._error(404, "The model `%s` does not exist." % model,
                                   "NotFoundError")
            if not state.healthy:
                return self._error(500, "EngineCore encountered an issue.", "InternalServerError")
            chat = path.endswith("chat/completions")
            max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
            if not isinstance(max_tokens, int) or max_tokens < 0:
                return self._error(400, "max_tokens must be a non-negative integer",
                                   "BadRequestError")
            prompt_tokens = count_prompt_tokens(body)
            state.awake.wait()  # a sleeping engine answers no completion until woken
            greedy = body.get("temperature") == 0
            steps = state.engine.generate(prompt_tokens, max_tokens,
                                          json.dumps(body.get("messages", body.get("prompt")))
                                          if greedy else None)
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
            if body.get("stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return self._stream(rid, model, chat, steps, prompt_tokens, usage)
            text, n_out = "", 0
            for chunk, n in steps:
                text += chunk
                n_out += n
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": None, "finish_reason": "length", "stop_reason": None}
                      if chat else
                      {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                       "stop_reason": None})
            return self._send(200, {
                "id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n_out,
                          "completion_tokens": n_out}})

        def _chunk(self, payload):
            data = ("data: " + json.dumps(payload) + "\n\n").encode() \
                if not isinstance(payload, bytes) else payload
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _stream(self, rid, model, chat, steps, prompt_tokens, include_usage):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            created = int(time.time())
            obj = "chat.completion.chunk" if chat else "text_completion"

            def event(delta_text, finish):
                if chat:
                    choice = {"index": 0, "delta": ({"content": delta_text} if delta_text
                                                    is not None else {}),
                              "logprobs": None, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": delta_text or "", "logprobs": None,
                              "finish_reason": finish, "stop_reason": None}
                return {"id": rid, "object": obj, "created": created, "model": model,
                        "choices": [choice]}

            n_out = 0
            try:
                if chat:
                    first = event("", None)
                    first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                    self._chunk(first)
                finish = "length"
                for text, n in steps:
                    if not state.awake.is_set():  # put to sleep meanwhile: vLLM's sleep aborts what runs
                        finish = "abort"           # (its default mode "abort"; 4 of 4 streams cut on the H200)
                        steps.close()
                        break
                    n_out += n
                    self._chunk(event(text, None))
                self._chunk(event(None if chat else "", finish))
                if include_usage:
                    self._chunk({"id": rid, "object": obj, "created": created, "model": model,
                                 "choices": [], "usage": {
                                     "prompt_tokens": prompt_tokens,
                                     "total_tokens": prompt_tokens + n_out,
                                     "completion_tokens": n_out}})
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                steps.close()
                self.close_connection = True
            self._access(200)

    return Handler


def _reason(code):
    return {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            500: "Internal Server Error", 503: "Service Unavailable"}.get(code, "")


def bind_socket(host, port):
    """Bind (not listen) like vLLM does before loading: the port is taken, but
    connections are refused until `start_http` listens. SO_REUSEPORT as vLLM sets it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address):  # a client going away is not news
        pass


def start_http(state, sock):
    """Listen on the bound `sock` and serve in a background thread; returns the server."""
    server = _Server(sock.getsockname()[:2], _make_handler(state), bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.address_family = sock.family
    sock.listen(128)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="http", daemon=True)
    thread.start()
    return server


# ---------------------------------------------------------------------------------------
# The demo server's own command line


def _parser():
    parser = argparse.ArgumentParser(
        prog="demo_server.py",
        description="DEMO OpenAI-compatible server (no GPU, no model) for trying llmfab.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port (default %(default)s)")
    parser.add_argument("--served-model-name", nargs="+", default=["demo-model"],
                        help="name(s) /v1/models lists (default %(default)s)")
    parser.add_argument("--load-seconds", type=float, default=2.0,
                        help="simulated start-up time before the port opens (default %(default)s)")
    parser.add_argument("--tokens-per-s", type=float, default=200.0,
                        help="generation speed per request (default %(default)s)")
    parser.add_argument("--num-speculative-tokens", type=int, default=0,
                        help="simulated draft length; 0 (the default, as a real engine given no "
                             "speculative flag) is no speculative decoding")
    parser.add_argument("--accept-rate", type=float, default=0.62,
                        help="simulated draft acceptance rate (default %(default)s)")
    parser.add_argument("--draft-cost", type=float, default=None,
                        help="cost of one drafted token as a share of a target step (e.g. "
                             "0.1); then speculative settings change the speed (default: "
                             "every token costs the same)")
    parser.add_argument("--accept-falls", action="store_true",
                        help="acceptance falls with the draft position (position i accepted "
                             "in accept-rate ** (i + 1) of the steps), as with real drafters")
    parser.add_argument("--api-key", default=None, help="require this bearer token on /v1/*")
    return parser


class StopSignal:
    """SIGTERM/SIGINT -> a stop request, signal-safe (a self-pipe, no lock anywhere).

    The handler does nothing: `signal.set_wakeup_fd` makes the interpreter's C-level
    handler write the signal number into the pipe, and `wait` selects on it. A handler
    that took a lock (threading.Event.set) would deadlock the main thread when a second
    signal lands while the first handler holds it.
    """

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self._r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        for s in signals:
            signal.signal(s, lambda signum, frame: None)
        self.requested = False

    def wait(self, timeout):
        """True once a stop signal arrived; else waits up to `timeout` s for one."""
        if not self.requested and select.select([self._r], [], [], max(0.0, timeout))[0]:
            os.read(self._r, 512)
            self.requested = True
        return self.requested


def main(argv=None):
    args = _parser().parse_args(argv)
    here = "demo_server.py"
    stop = StopSignal()
    log("DEMO server (no GPU, no model: tokens are made up), pid %d" % os.getpid(), where=here + ":20")
    log("non-default args: %s" % {k: v for k, v in vars(args).items()
                                  if v != _parser().get_default(k)}, where=here + ":21")
    sock = bind_socket(args.host, args.port)
    phases = (
        (0.6, "Model loading took 0.0000 GiB memory and %.1f seconds"),
        (0.2, "torch.compile takes %.1f s in total (simulated)"),
        (0.2, "Available KV cache memory: 0.00 GiB (simulated, warming up took %.1f s)"),
    )
    started = time.monotonic()
    log("Starting to load model %s..." % args.served_model_name[0], where=here + ":30")
    for share, text in phases:
        until = time.monotonic() + args.load_seconds * share
        while time.monotonic() < until:
            if stop.wait(min(0.2, until - time.monotonic())):
                return 0
        log(text % (time.monotonic() - started), where=here + ":31")
    log("init engine (profile, create kv cache, warmup model) took %.2f seconds"
        % (time.monotonic() - started), where=here + ":32")
    spec = (SpecDecodeSim(args.num_speculative_tokens, args.accept_rate, args.accept_falls)
            if args.num_speculative_tokens > 0 else None)
    metrics = Metrics(args.served_model_name[0], spec=spec)
    state = ServerState(Engine(metrics, tokens_per_s=args.tokens_per_s, spec=spec,
                               draft_cost=args.draft_cost),
                        args.served_model_name, api_key=args.api_key, version="demo")
    log("Starting vLLM-compatible DEMO API server on http://%s:%d" % (args.host, args.port),
        where=here + ":40")
    server = start_http(state, sock)
    raw("INFO:     Started server process [%d]" % os.getpid())
    raw("INFO:     Waiting for application startup.")
    raw("INFO:     Application startup complete.")
    while not stop.wait(3600):
        pass
    raw("INFO:     Shutting down")
    server.shutdown()
    raw("INFO:     Finished server process [%d]" % os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
