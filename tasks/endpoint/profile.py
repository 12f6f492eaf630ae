"""An endpoint profile: several ordinary profiles (the members) behind one port.

    [endpoint]
    name = "box"                 # the router's deployment: <workdir>/box/ (default: the file's stem)
    port = 8000                  # the one OpenAI URL
    host = "127.0.0.1"           # where the router listens (default loopback)
    admin_port = 8001            # loopback only: parking (fab sleep / wake / status); default port + 1
    members = ["chat.toml", "coder.toml"]   # ordinary profiles, relative to this file, started in this order
    idle_s = 0                   # a member with no request for this long is parked (0: never)
    haproxy = "haproxy"          # the router's program on the host
    [endpoint.idle]              # per member (its target.name): overrides idle_s
    coder = 600
    [endpoint.parked]            # per member: true = parked right after its start (its memory
    coder = true                 #  is then only what a sleeping server keeps)
    [endpoint.swap_port]         # per member: the internal port of its second slot (default: its port + 1000)
    chat = 9201

Two slots per member: slot a is the member's own profile; slot b is the same profile as the
deployment `<name>-b` on the member's swap port (written by llmfab, `extends` the member). A
redeploy of a running endpoint starts a changed member's new release in the slot not serving,
switches the router to it once it answers a real completion, then drains and stops the old
one (or keeps it parked, when the two do not fit the GPU together: `fab rollback` of the
endpoint is then a wake and a switch).

Every member is an ordinary profile: its own deploy directory, releases, logs, supervision.
Each member's [server] host/port is where the router reaches it on the same box; the model a
request names is the member's served name. The router itself is an ordinary deployment of
engine = "command" (HAProxy) generated from this file (tasks/endpoint/router.py).
"""
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..errors import ProfileError

KEYS = {"name", "port", "host", "admin_port", "members", "idle_s", "haproxy", "idle", "parked", "swap_port"}
SLOTS = ("a", "b")  # a member's two deployments: its own profile, and <name>-b on its swap port
SWAP_OFFSET = 1000  # the swap port's default: the member's port + this


@dataclass(frozen=True)
class EndpointMember:
    name: str            # the member's target.name
    path: Path           # its profile
    profile: object      # its validated Profile
    idle_s: float
    parked: bool
    swap_port: int = 0   # slot b's port (the router's second server of this member)

    def slot_name(self, slot):
        """The deployment name (target.name) of slot `slot`."""
        return self.name if slot == "a" else f"{self.name}-b"

    def slot_port(self, slot):
        return self.profile.server.port if slot == "a" else self.swap_port


@dataclass(frozen=True)
class Endpoint:
    path: Path
    name: str
    host: str
    port: int
    admin_port: int
    haproxy: str
    members: Tuple[EndpointMember, ...]
    hosts: Tuple[str, ...] = field(default_factory=tuple)

    def member(self, name):
        for m in self.members:
            if m.name == name:
                return m
        raise ProfileError(self.path, "members", f"a member named {name!r}",
                           got=", ".join(m.name for m in self.members))


def _read(path):
    from ..profile.load import tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ProfileError(path, None, f"cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(path, None, f"not valid TOML: {e}") from None


def is_endpoint(path):
    """True when the profile at `path` has an [endpoint] table (a cheap look, no validation)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError:
        return False
    return b"[endpoint" in head and "endpoint" in _read(path)


def _int(path, key, v, lo=1, hi=65535):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProfileError(path, f"endpoint.{key}", f"an integer from {lo} to {hi}", got=repr(v))
    return v


def _seconds(path, key, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ProfileError(path, key, "seconds, a number >= 0", got=repr(v))
    return float(v)


def load_endpoint(path, *, need_secrets=False):
    """The validated endpoint and its members' profiles; ProfileError (exit 2) naming the file
    and key for anything wrong, before any host is touched."""
    from ..profile import load_profile
    from .router import NAME_RE
    path = Path(path)
    data = _read(path)
    ep = data.get("endpoint")
    if not isinstance(ep, dict):
        raise ProfileError(path, "endpoint", "a table: [endpoint] with port and members")
    extra = set(data) - {"endpoint", "target"}
    if extra:
        raise ProfileError(path, sorted(extra)[0], "nothing but [endpoint] and [target] in an endpoint "
                                                   "profile (each member's settings live in its own profile)")
    unknown = set(ep) - KEYS
    if unknown:
        raise ProfileError(path, f"endpoint.{sorted(unknown)[0]}", "one of " + ", ".join(sorted(KEYS)))
    if "port" not in ep:
        raise ProfileError(path, "endpoint.port", "the port of the endpoint's one URL, e.g. port = 8000")
    port = _int(path, "port", ep["port"])
    admin_port = _int(path, "admin_port", ep.get("admin_port", port + 1))
    host = ep.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        raise ProfileError(path, "endpoint.host", "an address to listen on", got=repr(host))
    name = ep.get("name", path.stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ProfileError(path, "endpoint.name", "a name of letters, digits, . _ -", got=repr(name))
    haproxy = ep.get("haproxy", "haproxy")
    if not isinstance(haproxy, str) or not haproxy:
        raise ProfileError(path, "endpoint.haproxy", "the router's program (a path or a name on PATH)")
    files = ep.get("members")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
        raise ProfileError(path, "endpoint.members", 'a list of member profiles, e.g. ["chat.toml", "coder.toml"]')
    idle = _seconds(path, "endpoint.idle_s", ep.get("idle_s", 0))
    per_idle = ep.get("idle", {})
    parked = ep.get("parked", {})
    swaps = ep.get("swap_port", {})
    for key, table in (("idle", per_idle), ("parked", parked), ("swap_port", swaps)):
        if not isinstance(table, dict):
            raise ProfileError(path, f"endpoint.{key}", "a table: member name = value")
    members, names, models, ports = [], {}, {}, {port: "endpoint.port", admin_port: "endpoint.admin_port"}
    for i, rel in enumerate(files):
        mpath = (path.parent / rel) if not os.path.isabs(rel) else Path(rel)
        key = f"endpoint.members[{i}]"
        if not mpath.is_file():
            raise ProfileError(path, key, f"a member profile; {mpath} does not exist")
        if is_endpoint(mpath):
            raise ProfileError(path, key, f"an ordinary profile; {mpath} is an endpoint itself")
        prof = load_profile(mpath, need_secrets=need_secrets)
        mname = prof.target.name
        if not NAME_RE.match(mname):
            raise ProfileError(mpath, "target.name", "a name of letters, digits, . _ - (a router backend)",
                               got=repr(mname))
        if mname in names or mname == name:
            raise ProfileError(path, key, f"members with names of their own; {mpath} is named {mname!r} "
                                          f"like {names.get(mname, 'the endpoint')} (set its target.name)")
        names[mname] = str(mpath)
        model = prof.served_name
        if not model:
            raise ProfileError(mpath, "ready.served_name", "the model name requests will carry")
        if model in models:
            raise ProfileError(path, key, f"one member per model; {model!r} is served by {models[model]} too")
        models[model] = str(mpath)
        if prof.server.port in ports:
            raise ProfileError(mpath, "server.port", f"a port of its own; {prof.server.port} is "
                                                     f"{ports[prof.server.port]}")
        ports[prof.server.port] = str(mpath)
        m_idle = _seconds(path, f"endpoint.idle.{mname}", per_idle.get(mname, idle))
        m_parked = parked.get(mname, False)
        if not isinstance(m_parked, bool):
            raise ProfileError(path, f"endpoint.parked.{mname}", "true or false", got=repr(m_parked))
        if m_parked or m_idle:
            _need_sleep_mode(mpath, prof)
        members.append(EndpointMember(mname, mpath, prof, m_idle, m_parked))
    for i, m in enumerate(members):  # slot b's port: after every member's own, so any of them collides
        key = f"endpoint.swap_port.{m.name}"
        swap = _int(path, key[len("endpoint."):], swaps.get(m.name, m.profile.server.port + SWAP_OFFSET))
        if swap in ports:
            raise ProfileError(path, key, f"a port of its own for member {m.name}'s second slot; {swap} is "
                                          f"{ports[swap]}", got=str(swap))
        if f"{m.name}-b" in names:
            raise ProfileError(names[f"{m.name}-b"], "target.name", f"a name other than {m.name}-b "
                                                                    f"(member {m.name}'s second slot)")
        ports[swap] = f"member {m.name}'s swap port"
        members[i] = dataclasses.replace(m, swap_port=swap)
    for table, key in ((per_idle, "idle"), (parked, "parked"), (swaps, "swap_port")):
        for mname in table:
            if mname not in names:
                raise ProfileError(path, f"endpoint.{key}.{mname}", "a member's name: " + ", ".join(names))
    target = data.get("target", {})
    hosts = target.get("hosts", []) if isinstance(target, dict) else []
    return Endpoint(path, name, host, port, admin_port, haproxy, tuple(members), tuple(hosts))


def _need_sleep_mode(mpath, prof):
    """A member that may be parked must run with vLLM's sleep mode and its dev endpoints."""
    if prof.server.engine != "vllm":
        raise ProfileError(mpath, "server.engine", "vllm for a member that is parked (sleep mode is "
                                                   "vLLM's)", got=repr(prof.server.engine))
    if dict(prof.server.args).get("enable-sleep-mode") is not True:
        raise ProfileError(mpath, "server.args.enable-sleep-mode", "true for a member that is parked")
    if dict(prof.server.env).get("VLLM_SERVER_DEV_MODE") != "1":
        raise ProfileError(mpath, "server.env.VLLM_SERVER_DEV_MODE",
                           '"1" for a member that is parked (vLLM serves /sleep and /wake_up only then)')


def router_profile_text(ep: Endpoint, workdir: str, hosts) -> str:
    """The router's own profile (engine = "command", HAProxy), as TOML."""
    import json as _j
    from .router import router_files
    first = ep.members[0].profile.served_name
    files = [name for name, _, _ in router_files([], ep.host, ep.port, ep.admin_port)]
    return "\n".join([
        "# The endpoint's router, generated by llmfab from " + _j.dumps(str(ep.path)),
        "[target]",
        f"hosts = {_j.dumps(list(hosts))}",
        f"name = {_j.dumps(ep.name)}",
        f"workdir = {_j.dumps(workdir)}",
        "[server]",
        'engine = "command"',
        f"command = {_j.dumps([ep.haproxy, '-db', '-f', 'haproxy.cfg'])}",
        f"files = {_j.dumps(files)}",
        f"host = {_j.dumps('127.0.0.1' if ep.host in ('0.0.0.0', '::') else ep.host)}",
        f"port = {ep.port}",
        "[ready]",
        f"served_name = {_j.dumps(first)}",
        "poll_interval = 0.2",
        "timeout = 60",
    ]) + "\n"


def members_for_router(ep: Endpoint, expects=None):
    from .router import Member
    expects = expects or {}
    return [Member(m.name, m.profile.served_name, m.profile.server.host, m.profile.server.port, m.idle_s,
                   expects.get(m.name), m.swap_port) for m in ep.members]


def write_router_profile(ep: Endpoint, directory, hosts, expects=None) -> Path:
    """router.toml and the router's files in `directory`; returns router.toml's path.
    `expects`: {member: its check completion's raw text recorded at ready}."""
    from .router import write_router_dir
    d = write_router_dir(directory, members_for_router(ep, expects), ep.host, ep.port, ep.admin_port)
    workdir = ep.members[0].profile.target.workdir
    (d / "router.toml").write_text(router_profile_text(ep, workdir, hosts))
    return d / "router.toml"


def router_profile(ep: Endpoint, hosts):
    """The router's validated Profile (its files in a fresh temporary directory)."""
    import tempfile
    from ..profile import load_profile
    d = tempfile.mkdtemp(prefix=f"llmfab-endpoint-{ep.name}-")
    return load_profile(write_router_profile(ep, d, hosts), need_secrets=False)


def idle_of(ep: Endpoint) -> Dict[str, float]:
    return {m.name: m.idle_s for m in ep.members}


def parked_member(ep: Endpoint, name: Optional[str]):
    return [ep.member(name)] if name else list(ep.members)


def slot_profile(m: EndpointMember, slot, directory) -> Path:
    """The profile of member `m`'s slot: slot a is its own file; slot b a file in `directory`
    that extends it with target.name `<name>-b` and the swap port."""
    if slot == "a":
        return m.path
    from ..profile.toml_text import dumps, value
    p = Path(directory) / f"{m.slot_name('b')}.toml"
    p.write_text(f"# member {m.name}'s second slot, written by llmfab (fab deploy of an endpoint)\n"
                 f"extends = {value(str(m.path.resolve()))}\n"
                 + dumps({"target": {"name": m.slot_name("b")}, "server": {"port": m.swap_port}}))
    return p
