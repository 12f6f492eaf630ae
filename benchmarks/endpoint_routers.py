"""Routers in front of two OpenAI servers, side by side in one run (issue 39, item 1): what each
adds to TTFT and to tokens/s at concurrency 1 and 32, whether streaming stays intact, whether
it routes by the request's `model`, and how it answers an unknown model.

    python benchmarks/run.py endpoint-routers [--rounds 2] [--json OUT.json]

Two stand-in servers (configs/demo_server.py: model-a, model-b; 100 tokens/s per request, 32
tokens each, streamed) and, in front of them, each router found on this machine:

    haproxy       the endpoint's own config (tasks/endpoint/router.py: routing by `model`,
                  the parking hook's Lua action on every request)
    nginx-lua     nginx + lua (Debian's libnginx-mod-http-lua): the body's `model` read in
                  access_by_lua, proxy_pass to the member, proxy_buffering off
    vllm-router   the vLLM project's router (its wheel; $VLLM_ROUTER or on PATH), both
                  servers as --worker-urls
    litellm       LiteLLM's proxy ($LITELLM or on PATH), one model_list entry per server

A router that is not installed is reported as such (not skipped silently). Each round runs
every target once, the order rotating, so a load swing on this 2-core machine hits all alike.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tasks.endpoint.router import Member, write_router_dir  # noqa: E402

MODELS = {"model-a": 19301, "model-b": 19302}
PORTS = {"haproxy": 19310, "nginx-lua": 19311, "vllm-router": 19312, "litellm": 19313}
MAX_TOKENS = 32
TOKENS_PER_S = 100
# LiteLLM's proxy refuses to start without a master key; every client sends it (the others ignore it).
KEY = "sk-" + os.urandom(24).hex()


def wait_port(port, proc, seconds=60, path="/v1/models"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            if r.status < 500:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def one_request(port, model, stream=True):
    """(ttft_s, total_s, tokens, intact, status): one streamed completion. The first token is
    the first streamed choice and the count the stream's usage where the server sends it (a
    real tiny model's token may decode to no text), else the chunks with text."""
    body = json.dumps({"model": model, "prompt": "Hello there", "max_tokens": MAX_TOKENS,
                       "stream": stream, "temperature": 0, "ignore_eos": True,  # a tiny model's EOS
                       "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/v1/completions", body, {"content-type": "application/json",
                                                     "authorization": "Bearer " + KEY})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return None, time.monotonic() - t0, 0, False, r.status
        ttft, tokens, done, models, usage = None, 0, False, set(), None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            ev = json.loads(data)
            models.add(ev.get("model"))
            if ev.get("choices") and ttft is None:
                ttft = time.monotonic() - t0
            tokens += sum(1 for ch in ev.get("choices") or () if ch.get("text"))
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
        total = time.monotonic() - t0
        tokens = tokens if usage is None else usage
        intact = done and tokens == MAX_TOKENS and ttft is not None and ttft < total * 0.5
        return ttft, total, tokens, intact, 200
    except (OSError, ValueError, http.client.HTTPException):
        return None, time.monotonic() - t0, 0, False, -1
    finally:
        c.close()


def pct(values, q):
    v = sorted(values)
    if not v:
        return None
    return v[min(len(v) - 1, int(round(q / 100.0 * (len(v) - 1))))]


def run_load(port_for, concurrency, n):
    """n requests, `concurrency` at a time, alternating model-a / model-b."""
    names = list(MODELS)
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        res = list(pool.map(lambda i: one_request(port_for(names[i % 2]), names[i % 2]), range(n)))
    wall = time.monotonic() - t0
    ok = [r for r in res if r[4] == 200 and r[3]]
    ttfts = [r[0] for r in ok]
    return {"n": n, "ok": len(ok), "failed": n - len(ok),
            "statuses": sorted({r[4] for r in res if r[4] != 200}),
            "ttft_p50_ms": round(pct(ttfts, 50) * 1000, 2) if ttfts else None,
            "ttft_p99_ms": round(pct(ttfts, 99) * 1000, 2) if ttfts else None,
            "e2e_p50_ms": round(pct([r[1] for r in ok], 50) * 1000, 1) if ok else None,
            "tok_s": round(sum(r[2] for r in ok) / wall, 1)}


def unknown_model(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/v1/completions", json.dumps({"model": "no-such-model", "prompt": "x"}),
                  {"content-type": "application/json", "authorization": "Bearer " + KEY})
        r = c.getresponse()
        return r.status, r.read(300).decode("utf-8", "replace")
    except OSError as e:
        return None, str(e)
    finally:
        c.close()


def routes_by_model(port):
    """Every one of 8 requests per model answered by that model's server."""
    for name in MODELS:
        for _ in range(4):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                c.request("POST", "/v1/completions", json.dumps({"model": name, "prompt": "x",
                                                                 "max_tokens": 1}),
                          {"content-type": "application/json", "authorization": "Bearer " + KEY})
                r = c.getresponse()
                body = r.read()
                if r.status != 200 or json.loads(body).get("model") != name:
                    return False
            except (OSError, ValueError):
                return False
            finally:
                c.close()
    return True


NGINX_CONF = """
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  lua_package_path "/usr/share/lua/5.1/?.lua;;";
  upstream model-a {{ server 127.0.0.1:{a}; keepalive 64; }}
  upstream model-b {{ server 127.0.0.1:{b}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    client_body_buffer_size 256k;
    location / {{
      set $member "";
      access_by_lua_block {{
        ngx.req.read_body()
        local body = ngx.req.get_body_data() or ""
        local model = string.match(body, '"model"%s*:%s*"([^"]*)"')
        local known = {{["model-a"] = true, ["model-b"] = true}}
        if not model or not known[model] then
          ngx.status = 404
          ngx.header["content-type"] = "application/json"
          ngx.say('{{"error":{{"message":"unknown model","code":404}}}}')
          return ngx.exit(404)
        end
        ngx.var.member = model
      }}
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_pass http://$member;
    }}
  }}
}}
"""


def start_routers(tmp, logs):
    """{name: (proc or None, reason or None)}."""
    out = {}
    hap = shutil.which("haproxy")
    if hap:
        d = write_router_dir(Path(tmp) / "haproxy", [Member(n.replace("model-", ""), n, "127.0.0.1", p)
                                                     for n, p in MODELS.items()],
                             "127.0.0.1", PORTS["haproxy"], 19319)
        out["haproxy"] = (subprocess.Popen([hap, "-db", "-f", "haproxy.cfg"], cwd=d, stdout=logs,
                                           stderr=logs, start_new_session=True), None)
    else:
        out["haproxy"] = (None, "haproxy not installed")
    ngx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    lua_mod = Path("/usr/lib/nginx/modules/ngx_http_lua_module.so")
    if ngx and lua_mod.exists():
        d = Path(tmp) / "nginx"
        d.mkdir()
        (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, a=MODELS["model-a"], b=MODELS["model-b"],
                                                         port=PORTS["nginx-lua"]))
        out["nginx-lua"] = (subprocess.Popen([ngx, "-p", str(d), "-c", str(d / "nginx.conf"), "-g",
                                              "daemon off;"], stdout=logs, stderr=logs,
                                             start_new_session=True), None)
    else:
        out["nginx-lua"] = (None, "nginx or its lua module not installed")
    vr = os.environ.get("VLLM_ROUTER") or shutil.which("vllm-router")
    if vr:
        out["vllm-router"] = (subprocess.Popen(
            [vr, "--host", "127.0.0.1", "--port", str(PORTS["vllm-router"]), "--prometheus-port", "19318",
             "--worker-urls"] + [f"http://127.0.0.1:{p}" for p in MODELS.values()],
            stdout=logs, stderr=logs, start_new_session=True), None)
    else:
        out["vllm-router"] = (None, "vllm-router not installed (set VLLM_ROUTER)")
    ll = os.environ.get("LITELLM") or shutil.which("litellm")
    if ll:
        cfg = Path(tmp) / "litellm.yaml"
        cfg.write_text("model_list:\n" + "".join(
            f"  - model_name: {n}\n    litellm_params:\n      model: openai/{n}\n"
            f"      api_base: http://127.0.0.1:{p}/v1\n      api_key: sk-none\n"
            for n, p in MODELS.items()))
        env = dict(os.environ, LITELLM_LOG="ERROR", LITELLM_MASTER_KEY=KEY)
        out["litellm"] = (subprocess.Popen([ll, "--config", str(cfg), "--host", "127.0.0.1", "--port",
                                            str(PORTS["litellm"]), "--num_workers", "1"],
                                           stdout=logs, stderr=logs, env=env, start_new_session=True), None)
    else:
        out["litellm"] = (None, "litellm not installed (set LITELLM)")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py endpoint-routers", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n1", type=int, default=20, help="requests at concurrency 1 per round")
    ap.add_argument("--n32", type=int, default=128, help="requests at concurrency 32 per round")
    ap.add_argument("--json", help="write the results there too")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="endpoint-routers-")
    logs = open(Path(tmp) / "routers.log", "ab")
    procs = []
    try:
        for name, port in MODELS.items():
            procs.append(subprocess.Popen(
                [sys.executable, str(REPO / "configs" / "demo_server.py"), "--port", str(port),
                 "--served-model-name", name, "--load-seconds", "0", "--num-speculative-tokens", "0",
                 "--tokens-per-s", str(TOKENS_PER_S)], stdout=logs, stderr=logs, start_new_session=True))
        for (name, port), p in zip(MODELS.items(), procs):
            assert wait_port(port, p), f"{name} did not start"
        routers = start_routers(tmp, logs)
        procs += [p for p, _ in routers.values() if p is not None]
        targets = {"direct": lambda m: MODELS[m]}
        notes = {}
        for name, (p, why) in routers.items():
            if p is None:
                notes[name] = why
            elif wait_port(PORTS[name], p, 90, "/health"):
                targets[name] = (lambda port: lambda m: port)(PORTS[name])
            else:
                notes[name] = "did not start (see %s)" % (Path(tmp) / "routers.log")
        facts = {}
        for name, port_for in targets.items():
            if name == "direct":
                facts[name] = {"routes_by_model": None, "unknown_model": None}
                continue
            port = port_for("model-a")
            status, body = unknown_model(port)
            facts[name] = {"routes_by_model": routes_by_model(port),
                           "unknown_model": {"status": status, "body": body[:200]}}
        runs = {name: {"c1": [], "c32": []} for name in targets}
        order = list(targets)
        for rnd in range(args.rounds):
            for name in order[rnd % len(order):] + order[:rnd % len(order)]:
                runs[name]["c1"].append(run_load(targets[name], 1, args.n1))
                runs[name]["c32"].append(run_load(targets[name], 32, args.n32))
        result = {"max_tokens": MAX_TOKENS, "tokens_per_s_per_request": TOKENS_PER_S,
                  "rounds": args.rounds, "not_measured": notes, "facts": facts, "runs": runs}
        print(render(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        logs.close()


def _med(values):
    v = sorted(x for x in values if x is not None)
    return v[len(v) // 2] if v else None


def render(result):
    rows = ["| target | c | TTFT p50 ms | TTFT p99 ms | tok/s | failed | routes by model | unknown model |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        f = result["facts"][name]
        unk = f["unknown_model"]
        for c in ("c1", "c32"):
            rs = r[c]
            rows.append("| %s | %s | %s | %s | %s | %d | %s | %s |" % (
                name, c[1:], _med([x["ttft_p50_ms"] for x in rs]), _med([x["ttft_p99_ms"] for x in rs]),
                _med([x["tok_s"] for x in rs]), sum(x["failed"] for x in rs),
                "-" if f["routes_by_model"] is None else ("yes" if f["routes_by_model"] else "NO"),
                "-" if unk is None else unk["status"]))
    for name, why in result["not_measured"].items():
        rows.append(f"| {name} | - | not measured: {why} | | | | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
