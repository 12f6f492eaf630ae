"""`fab targets [--out FILE]`: where Prometheus finds every running deployment's /metrics.

The document is Prometheus' file_sd format, one entry per host where the profile's
deployment runs:

    [{"targets": ["10.0.0.5:8000"],
      "labels": {"llmfab_deployment": "qwen", "llmfab_release": "20250101T120000Z",
                 "llmfab_engine": "vllm", "llmfab_model": "Qwen3", "llmfab_host": "gpu-1"}}]

HOST is the address the server's port is reachable at: the ssh config's HostName for the
host (what Fabric resolves `-H gpu-1` to), 127.0.0.1 for `local`. PORT, the release, the
engine and the served model are those of the release that runs now (its saved
profile.toml: after a rollback they may differ from the profile given). Hosts that are
down, not deployed or not running are left out and named on stderr; exit 3 if one could
not be reached, the document is written all the same. `--out FILE` replaces FILE in one
rename (a temporary file beside it first), so Prometheus never reads half a document;
without it the document goes to stdout and everything else to stderr.

Only a regular file or a new name is replaced so. `--out /dev/stdout` (`/dev/stderr`,
`/dev/fd/N`, `/proc/self/fd/N`, a shell's `>(cmd)`) is written to that open descriptor, and a
character device or a FIFO is written in place; any other thing at FILE (a symbolic link, a
block device, a socket) is refused before any host is touched, as root too: llmfab never
writes through what it did not create.
"""
import json
import os
import re
import sys

from .errors import ExitCode, UsageError
from .fleet.fanout import HostResult, worst
from .base.host.hosterrors import error_words
from .base.host.safefile import kind, writable_dir


def address(host, server_host):
    """HOST of HOST:PORT: the ssh config's HostName, or for `local` where the server listens."""
    if host.local:
        from .steps.host.probe import probe_host
        name = probe_host(server_host)
    else:
        host.connect()
        name = host.cxn.host
    return f"[{name}]" if ":" in name and not name.startswith("[") else name


def loopback(server_host):
    return server_host in ("localhost", "::1") or server_host.startswith("127.")


def entry(addr, port, labels):
    return {"targets": [f"{addr}:{port}"], "labels": labels}


def running_entry(host, profile, reporter):
    """(file_sd entry or None, why it was left out)."""
    from .steps.preflight import deploy_dir
    from .releases import saved_profile
    ddir = deploy_dir(profile)
    host.start()
    st = host.call("state", deploy_dir=ddir)
    server = st.get("server")
    if not server:
        return None, f"not deployed here ({ddir})"
    if not st.get("alive"):
        return None, f"not running (release {server.get('release')})"
    text = host.call("release_profile", deploy_dir=ddir, release=server["release"])["profile_toml"]
    ran = saved_profile(text, profile)
    model = ran.served_name or ran.server.model or ""
    if loopback(ran.server.host) and not host.local:
        reporter.line(host.name, f"note: the server listens on {ran.server.host} only: Prometheus "
                                 "must scrape it from that host (or set [server] host = \"0.0.0.0\")")
    labels = {"llmfab_deployment": profile.target.name, "llmfab_release": server["release"],
              "llmfab_engine": ran.server.engine, "llmfab_model": model,
              "llmfab_host": host.name}
    port = server.get("port") or ran.server.port
    return entry(address(host, ran.server.host), port, labels), None


# Names of one of this process's own descriptors (the kernel's links to what the shell opened).
FD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
FD_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd|proc/(\d+)/fd)/(\d+)$")


def _own_fd(path):
    """The descriptor number `path` names (/dev/stdout, /dev/fd/N, /proc/self/fd/N), or None."""
    if path in FD_NAMES:
        return FD_NAMES[path]
    m = FD_PATH.match(path)
    if m and (m.group(1) is None or int(m.group(1)) == os.getpid()):
        return int(m.group(2))
    return None


def out_target(value):
    """Where --out goes, checked before any host is touched (else UsageError, nothing done):
    ("fd", N) for one of our descriptors, ("in place", path) for a character device or a
    FIFO, ("replace", path) for a regular file or a new name in an existing directory."""
    import stat
    raw = os.path.expanduser(str(value))
    path = os.path.abspath(raw)
    fd = _own_fd(path)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise UsageError(f"--out {value}: descriptor {fd} is not open in this process") from None
        return "fd", fd
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"--out {value}: {error_words(e)}") from None
    if st is None or stat.S_ISREG(st.st_mode):
        if not os.path.isdir(os.path.dirname(path)):
            raise UsageError(f"--out {value}: the directory {os.path.dirname(path)} does not exist")
        try:
            writable_dir(path)
        except OSError as e:
            raise UsageError(f"--out {value}: {e}") from None
        return "replace", path
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--out {value}: is a directory; name the file, e.g. {path}/llmfab.json")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return "in place", path
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"--out {value}: is a symbolic link (to {os.readlink(path)}); llmfab never "
                         "writes through a link: name the file it points to")
    raise UsageError(f"--out {value}: is {kind(st.st_mode)}; name a regular file, a FIFO or "
                     "/dev/stdout")


def out_path(value):
    """--out as an absolute path (else UsageError: nothing is done); see out_target."""
    how, where = out_target(value)
    return f"/dev/fd/{where}" if how == "fd" else where


def write_out(value, text):
    """`text` to --out as out_target says: a regular file 0644 (Prometheus reads it) replaced
    in one rename, never through a planted link or temporary name. -> the path written.
    OperationFailed naming the path when the write fails (a full disk, /dev/full, a closed pipe)."""
    from .errors import OperationFailed
    from .base.host.safefile import failed, replace
    how, where = out_target(value)
    data = text.encode("utf-8")
    try:
        if how == "replace":
            return replace(where, data, 0o644)
        fd = where if how == "fd" else os.open(where, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            if how != "fd":
                os.close(fd)
    except OSError as e:
        raise OperationFailed(f"--out: {failed(value, e)}") from None
    return str(value)



def gather(hosts, profile, reporter, run):
    """Entries in host order; `run(op)` runs op(host, reporter) -> HostResult on every host."""
    found = {}

    def op(host, reporter):
        got, why = running_entry(host, profile, reporter)
        if got is None:
            reporter.line(host.name, f"left out: {why}")
            return HostResult(host.name, ExitCode.OK, f"left out: {why}")
        found[host.name] = got
        return HostResult(host.name, ExitCode.OK, got["targets"][0])

    results = run(op)
    for r in results:
        if r.code and r.host not in found:
            reporter.line(r.host, "left out: " + r.summary)
    return [found[h] for h in hosts if h in found], results


def render(entries):
    return json.dumps(entries, indent=2, ensure_ascii=False) + "\n"


def targets(c, opts):
    """Body of `fab targets` (opts: tasks.options.TargetsOptions)."""
    from .errors import TaskFailed
    from .output import Reporter
    from .fleet.runner import hosts_for, load, run_hosts
    profile = load(c, opts.profile)
    if opts.out:
        out_target(opts.out)  # bad input: before any host is touched
    hosts = hosts_for(c, profile)
    reporter = Reporter(hosts, json_mode=True)  # human text on stderr: stdout is the document
    entries, results = gather(hosts, profile, reporter,
                              lambda op: run_hosts(c, profile, op, opts, reporter, hosts=hosts))
    text = render(entries)
    if opts.out:
        path = write_out(opts.out, text)
        reporter.line("", f"wrote {len(entries)} target(s) of {len(hosts)} host(s) to {path}")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    code = worst(r.code for r in results)
    if code:
        raise TaskFailed(int(code))
