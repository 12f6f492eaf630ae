"""Host-side probes: HTTP health and models, the port's holder, poll ticks (the log read by tasks/base/host/startlog.py)."""
import errno
import json
import os

from ...base.host.startlog import read_log
from ...gpu.host import nvsmi
from ...base.host.hosterrors import error_words
from ...base.host.layout import read_exit
from ...base.host.procfs import cmdline, fd_targets, pid_alive, pids, stat_fields
from ...base.host.statefiles import expand

# [server] host values that mean every interface: anyone who reaches the host reaches the
# server (the preflight's exposure warning), and on the host itself it answers on 127.0.0.1.
ALL_INTERFACES = ("0.0.0.0", "::", "[::]", "")


def http_get(port, path, host="127.0.0.1", timeout=2.0, headers=None):
    """(status, body bytes) or (None, error text). Never raises."""
    # Imported here, not at the top: urllib.request pulls in http.client, email and ssl
    # (~25 ms), which an agent that never probes HTTP (deploy --no-wait, stop) skips.
    import http.client
    import urllib.error
    import urllib.request
    url = "http://%s:%d%s" % (host, port, path)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=timeout) as r:
            return r.status, r.read(1 << 20)
    except urllib.error.HTTPError as e:
        return e.code, e.read(1 << 16) if e.fp else b""
    except (OSError, ValueError, http.client.HTTPException) as e:  # HTTPException: not HTTP at all
        return None, error_words(e).encode()


def probe_host(server_host):
    """Where to reach the server from the host itself (the agent's probes, the supervisor's
    hang watch, `fab targets` for the `local` host)."""
    return "127.0.0.1" if server_host in ALL_INTERFACES or server_host == "localhost" else server_host


def served_models(port, path, host="127.0.0.1", api_key=None):
    """The names /v1/models lists, or None. vLLM and SGLang guard /v1/* with --api-key
    (/health stays open): without the key the list is a 401, and a deploy would wait for it
    until its timeout."""
    headers = {"Authorization": "Bearer " + api_key} if api_key else None
    status, body = http_get(port, path, host, headers=headers)
    if status != 200:
        return None
    try:
        return [m.get("id") for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        return None


def _listening_inodes(port):
    inodes = set()
    local_port = ":%04X " % port  # the local address field ends so; most lines are skipped unsplit
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    if local_port not in line:
                        continue
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except (OSError, StopIteration):
            continue
    return inodes


def _address(hex_addr):
    """/proc/net/tcp{,6}'s local address field as text: IPv4 is one 32-bit word, IPv6 four,
    each in the host's byte order (little-endian on every host llmfab runs on)."""
    import socket
    import struct
    raw = bytes.fromhex(hex_addr)
    words = b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    if len(words) == 4:
        return socket.inet_ntop(socket.AF_INET, words)
    text = socket.inet_ntop(socket.AF_INET6, words)
    return text[7:] if text.startswith("::ffff:") and "." in text else text


def listening_sockets():
    """{socket inode: (address, port)} of every listening TCP socket in /proc/net/tcp{,6}."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        addr, port = parts[1].rsplit(":", 1)
                        out[parts[9]] = (_address(addr), int(port, 16))
        except (OSError, StopIteration, ValueError):
            continue
    return out


def tree_listeners(root, port=None):
    """[[address, port]] on which `root`'s process tree listens (only `port`, if given), sorted:
    what the server really binds, whatever its argv says (`python -m http.server` binds every
    address without a word)."""
    by_inode = listening_sockets()
    found = set()
    if by_inode:
        for pid in process_tree(root):
            for target in fd_targets(pid):
                if target.startswith("socket:["):
                    sock = by_inode.get(target[8:-1])
                    if sock is not None and (port is None or sock[1] == port):
                        found.add(sock)
    return [list(s) for s in sorted(found)]


def listening_ports():
    """{socket inode: TCP port} of every listening socket in /proc/net/tcp{,6}."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        out[parts[9]] = int(parts[1].rsplit(":", 1)[1], 16)
        except (OSError, StopIteration, ValueError):
            continue
    return out


def process_tree(root):
    """`root` and every process below it (by parent pid), from one pass over /proc."""
    children = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def tree_ports(root):
    """The TCP ports that `root`'s process tree listens on."""
    by_inode = listening_ports()
    if not by_inode:
        return set()
    ports = set()
    for pid in process_tree(root):
        for target in fd_targets(pid):
            if target.startswith("socket:["):
                port = by_inode.get(target[8:-1])
                if port is not None:
                    ports.add(port)
    return ports


def serving_elsewhere(root, port, host, health_path):
    """The port other than `port` on which `root`'s process tree listens and answers
    `health_path` with 200, or None: a server told one port that bound another."""
    for other in sorted(tree_ports(root) - {port}):
        if http_get(other, health_path, host, timeout=1.0)[0] == 200:
            return other
    return None


def port_holders(port):
    """[{pid, cmdline}] of processes listening on port (visible in this PID namespace)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {"socket:[%s]" % i for i in inodes}
    return [{"pid": pid, "cmdline": cmdline(pid)} for pid in pids() if wanted.intersection(fd_targets(pid))]


def port_in_use(host, port):
    """None if free, else a description of who holds it.

    A bind, exactly as the server will try it, says whether the port is free; only a
    refused one reads /proc/net/tcp{,6} to name the holder. The kernel walks its whole
    TCP hash table to write those files (~5 ms each on a host with much memory, however
    few sockets there are), too much for every preflight of a port that is free."""
    # _socket is the C module behind socket.py, whose enums cost every preflight ~5 ms
    # to build at import; a bind needs none of them.
    import _socket as socket
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Servers set SO_REUSEADDR too: connections of a just-stopped server lingering
        # in TIME_WAIT must not make a free port look taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return None
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return "cannot bind %s:%d: %s" % (host, port, e.strerror)
    finally:
        s.close()
    if not _listening_inodes(port):  # bound, not listening: in no /proc/net table
        return "a process that bound it without listening (a server still starting?)"
    holders = port_holders(port)
    if holders:
        return "; ".join("pid %d (%s)" % (h["pid"], h["cmdline"][:200]) for h in holders)
    return "a process not visible from here (another PID namespace or user)"


def op_poll(deploy_dir, release, pid, port, host="127.0.0.1", log_offset=0, health_path="/health",
            models_path=None, api_key=None, listeners=False, nvidia_smi=None, devices=None):
    """One wait tick: process alive, new log lines, /health, /v1/models (`models_path`), where
    it listens (`listeners`), GPU memory (`nvidia_smi`)."""
    ddir = expand(deploy_dir)
    rdir = os.path.join(ddir, "releases", release)
    out = {"alive": pid_alive(pid), "exit": read_exit(rdir, pid)}
    out["log"] = read_log(os.path.join(rdir, "server.log"), log_offset)
    host = probe_host(host)
    out["health"] = out["models"] = None
    if out["alive"]:
        status, body = http_get(port, health_path, host)
        out["health"] = status if status is not None else body.decode("utf-8", "replace")
        if status == 200 and models_path:
            out["models"] = served_models(port, models_path, host, api_key)
        if listeners:  # where it really listens (status's exposure warning)
            out["listening"] = tree_listeners(pid, port)
    if nvidia_smi:
        out["gpus"] = nvsmi.select(nvsmi.read_gpus(nvidia_smi), devices)
    return out

