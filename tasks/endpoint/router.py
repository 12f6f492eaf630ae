"""The endpoint's router: HAProxy (chosen by measurement: benchmarks/endpoint_routers.py,
docs/endpoint.md), configured here from the members. Pure: text in, files out.

HAProxy routes each POST by the request body's `model` (`json_query('$.model')`, a map from
served name to member), answers `/v1/models` (every member, awake or parked) and `/health`
itself, and answers an unknown model with the OpenAI-shaped 404 naming the models there are.
Parking and waking are the Lua hook's (llmfab_park.lua); its admin service listens on a
loopback port of its own.
"""
import json
import re
from dataclasses import dataclass
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
LUA_FILE = Path(__file__).with_name("llmfab_park.lua")
# The largest request body HAProxy reads to find `model` (its buffer): a longer body's `model`
# is found only when it comes first, as every OpenAI client sends it.
BUFSIZE = 262144
# The known greedy completion checked after every wake (level 1 keeps the weights, as measured on the H200: docs/endpoint.md;
# the text must match the one recorded at ready before traffic returns).
CHECK_PROMPT = "The capital of France is"
CHECK_TOKENS = 8


@dataclass(frozen=True)
class Member:
    name: str          # the member's name in the endpoint (its backend)
    model: str         # the served name a request's `model` carries
    host: str          # where the router reaches it (the member's [server] host)
    port: int
    idle_s: float = 0  # parked after this long without a request (0: never by itself)
    expect: str = None  # its check completion's raw text, recorded at ready (None: the router records it)
    swap_port: int = 0  # its second slot's port (0: none)


def check_body(model):
    return json.dumps({"model": model, "prompt": CHECK_PROMPT, "max_tokens": CHECK_TOKENS,
                       "temperature": 0, "seed": 0})


def _lua_str(s):
    """A Lua string literal of `s`'s UTF-8 bytes (anything but plain ASCII as \\ddd)."""
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ._-:/{}[],=@")
    return '"' + "".join(chr(b) if b in safe else "\\%03d" % b
                         for b in s.encode("utf-8", "surrogateescape")) + '"'


def members_lua(members):
    rows = []
    for m in members:
        addr = "127.0.0.1" if m.host in ("0.0.0.0", "::", "") else m.host
        expect = "nil" if m.expect is None else _lua_str(m.expect)
        rows.append("  [%s] = {backend = %s, addr = %s, ports = {a = %d, b = %d}, idle_s = %s, check = %s, "
                    "expect = %s},"
                    % (_lua_str(m.name), _lua_str("be_" + m.name), _lua_str(addr), m.port, m.swap_port or 0,
                       repr(float(m.idle_s)), _lua_str(check_body(m.model)), expect))
    return "return {\n" + "\n".join(rows) + "\n}\n"


def models_json(members):
    return json.dumps({"object": "list", "data": [
        {"id": m.model, "object": "model", "created": 0, "owned_by": "llmfab", "root": m.model,
         "parent": None} for m in members]}, indent=1) + "\n"


def models_map(members):
    return "".join(f"{m.model} {m.name}\n" for m in members)


def _q(text):
    """A HAProxy double-quoted string holding `text`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def haproxy_cfg(members, host, port, admin_port, *, nbthread=None):
    names = ", ".join(m.model for m in members)
    not_found = ('{"error":{"message":"The model `%[var(txn.model),json(utf8s)]` does not exist '
                 f'on this endpoint. Models here: {names}.","type":"NotFoundError",'
                 '"param":"model","code":404}}')
    wake_failed = ('{"error":{"message":"model %[var(txn.model),json(utf8s)] is parked and did '
                   'not wake: %[var(txn.wake_error),json(utf8s)]","type":"ServiceUnavailable",'
                   '"param":"model","code":503}}')
    lines = [
        "# Written by llmfab (fab deploy of an endpoint profile): do not edit, redeploy.",
        "global",
        "  lua-load llmfab_park.lua",
        f"  tune.bufsize {BUFSIZE}",
        "  stats socket unix@haproxy.sock mode 600 level admin",
    ]
    if nbthread:
        lines.append(f"  nbthread {int(nbthread)}")
    lines += [
        "defaults",
        "  mode http",
        "  option http-no-delay  # stream each token chunk as it comes (no MSG_MORE batching)",
        "  timeout connect 5s",
        "  timeout client 1h",
        "  timeout server 1h",
        "  timeout http-request 60s",
        "",
        "frontend endpoint",
        f"  bind {host}:{port}",
        "  option http-buffer-request",
        "  http-request return status 200 content-type application/json file models.json"
        " if { path /v1/models } METH_GET",
        "  http-request return status 200 content-type text/plain string ok if { path /health }",
        "  http-request set-var(txn.model) req.body,json_query('$.model') if METH_POST",
        "  http-request set-var(txn.member) var(txn.model),map(models.map)",
        f"  http-request return status 404 content-type application/json lf-string {_q(not_found)}"
        " if !{ var(txn.member) -m found }",
        "  http-request lua.llmfab_wake",
        f"  http-request return status 503 content-type application/json lf-string {_q(wake_failed)}"
        " if { var(txn.wake_error) -m len gt 0 }",
        "  use_backend be_%[var(txn.member)]",
        "",
        "frontend admin",
        f"  bind 127.0.0.1:{admin_port}",
        "  http-request use-service lua.llmfab_admin",
    ]
    for m in members:
        addr = "127.0.0.1" if m.host in ("0.0.0.0", "::", "") else m.host
        # Two slots: `a` serves; `b` (the swap port) is where a new release starts, in maintenance
        # until the parking hook switches to it (llmfab_park.lua: /switch; live.lua after a restart).
        lines += ["", f"backend be_{m.name}", f"  server a {addr}:{m.port}"]
        if m.swap_port:
            lines.append(f"  server b {addr}:{m.swap_port} disabled")
    return "\n".join(lines) + "\n"


def router_files(members, host, port, admin_port, *, nbthread=None):
    """[(name, bytes, mode)]: what the router's release directory holds."""
    return [
        ("haproxy.cfg", haproxy_cfg(members, host, port, admin_port, nbthread=nbthread).encode(), 0o600),
        ("llmfab_park.lua", LUA_FILE.read_bytes(), 0o600),
        ("members.lua", members_lua(members).encode(), 0o600),
        ("models.json", models_json(members).encode(), 0o644),
        ("models.map", models_map(members).encode(), 0o600),
    ]


def write_router_dir(directory, members, host, port, admin_port, *, nbthread=None):
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, data, mode in router_files(members, host, port, admin_port, nbthread=nbthread):
        (d / name).write_bytes(data)
        (d / name).chmod(mode)
    return d
