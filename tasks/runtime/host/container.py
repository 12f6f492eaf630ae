"""A release's server in a container of podman or docker (host half; the engine's binary is a
parameter, everything else is one code path).

`launch` runs `ENGINE run -d` with the release's argv after the image byte for byte (run_argv,
golden-tested), `--init` (a Python PID 1 ignores SIGTERM: `stop` would wait out the grace),
host networking and IPC, the GPUs of [gpu] devices (CDI or --gpus), the deployment directory,
model directories and [container] mounts bound at the same paths, the environment and secrets
through an env file of mode 0600 (never `-e KEY=VALUE` on the host's argv; removed once the
engine has read it), and the restart policy mapped from [supervise]. The container's entry is
a constant script in the release (ENTRY_SCRIPT; the deployment directory is bound): it appends the server's
output to the release's server.log, where tail-log, the failure explainer and the start-up
profile read it, and execs the argv (no shell parses a profile value). The server's
processes carry LLMFAB_RELEASE like a launcher's; their host pids are `pids`: every process
in the container's PID namespace (init's, from `inspect` State.Pid). `stop` is the engine's
stop with the grace as its timeout; `state` is the container's status, exit code and restarts.
Standard library only, Python >= 3.9.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

from ...base.host import engineid
from ...base.host.hosterrors import Damaged, HostError
from ...base.host.hostenv import which
from ...base.host.layout import STOP_FILE, mark_stopped, release_marker
from ...base.host.procfs import cmdline, pid_alive, proc_read
from ...base.host.statefiles import read_json, utc_iso, write_json
from ...release.host.release_dirs import release_launcher

ENGINES = ("podman", "docker")
ENGINE_TIMEOUT_S = 60.0    # one run/inspect/rm of the engine; `stop` adds the grace
FIND_SERVER_S = 2.0        # after `run -d`: until the init has started the server
ENTRY_FILE = "container-entry.sh"
ENV_FILE = "container.env"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
MODULE = "llmfab_host.runtime.host.container"  # run from the release directory (it carries llmfab_host)
WATCH_DOWN_S = 60.0  # the hang watch ends once its container has been down this long (no restart came)
# The entry: constant text, no profile value in it. `$@` is the release's argv, given by the
# engine after the image exactly as argv.json holds it.
ENTRY_SCRIPT = """#!/bin/sh
# llmfab's container entry (tasks/runtime/host/container.py): the server's output goes to the
# release's server.log, then the server replaces this shell. A restart by the container engine
# is marked in the log, as llmfab's supervisor marks its own.
log="$LLMFAB_RELEASE/server.log"
if [ -e "$LLMFAB_RELEASE/.container-started" ]; then
    echo "--- llmfab: restart of the server by the container engine ---" >>"$log"
fi
: >"$LLMFAB_RELEASE/.container-started"
exec "$@" >>"$log" 2>&1
"""
# [supervise] restart -> the engine's --restart (max_restarts is on-failure's retry count).
RESTART_POLICY = {"no": "no", "on-failure": "on-failure:{max_restarts}", "always": "always"}
# How the GPUs of [gpu] devices reach the container, by [container] gpus.
GPU_FLAGS = {
    "cdi": lambda devs: ["--device", "nvidia.com/gpu=all"] if devs is None
    else [x for d in devs for x in ("--device", "nvidia.com/gpu=%d" % d)],
    "gpus": lambda devs: ["--gpus", "all" if devs is None else "device=" + ",".join(str(d) for d in devs)],
    "none": lambda devs: [],
}
GPU_FIXES = {
    "cdi": "install the NVIDIA Container Toolkit and write the CDI spec: `nvidia-ctk cdi generate "
           "--output=/etc/cdi/nvidia.yaml` (or set [container] gpus = \"gpus\" for the toolkit's hook)",
    "gpus": "install the NVIDIA Container Toolkit and configure the engine: `nvidia-ctk runtime "
            "configure --runtime=docker` then restart docker (or set [container] gpus = \"cdi\")",
}


def container_name(name):
    """The container of deployment `name` (one per deployment; a release replaces it)."""
    return "llmfab-" + name


def run_argv(spec, rdir, argv, env_file):
    """The engine's whole `run` command for release directory `rdir`: options, the image, then
    `argv` unchanged. Pure (golden-tested)."""
    ddir = os.path.dirname(os.path.dirname(rdir))
    out = [spec["engine"], "run", "--detach", "--name", spec["name"], "--init",
           "--network=host", "--ipc=host", "--env-file", env_file,
           "--restart", spec["restart"], "--stop-timeout", str(int(math.ceil(spec["grace"]))),
           "--label", "llmfab.deploy_dir=" + ddir, "--label", "llmfab.release=" + os.path.basename(rdir),
           "--workdir", rdir, "--entrypoint", os.path.join(rdir, ENTRY_FILE)]
    out += GPU_FLAGS[spec["gpus"]](spec.get("devices"))
    mounts = [(ddir, ddir, False)]
    mounts += [tuple(m) for m in spec.get("mounts", ())]
    for src, dst, ro in mounts:
        out += ["--volume", "%s:%s%s" % (src, dst, ":ro" if ro else "")]
    return out + list(spec.get("engine_args", ())) + [spec["image"]] + list(argv)


def env_file_text(env):
    """KEY=VALUE lines as podman and docker read --env-file: a value is taken as written, to the
    end of its line, so one with a newline cannot pass (HostError naming the variable)."""
    lines = []
    for key, value in env.items():
        if "\n" in value or "\r" in value or "\0" in value:
            raise HostError("[server.env] %s has a line break: a container's env file cannot carry it"
                            % key, kind="launch_failed")
        lines.append("%s=%s\n" % (key, value))
    return "".join(lines)


def _engine(spec_or_name, *args, timeout=ENGINE_TIMEOUT_S, check=True):
    engine = spec_or_name["engine"] if isinstance(spec_or_name, dict) else spec_or_name
    try:
        proc = subprocess.run([engine] + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        raise HostError("%s is not installed on this host (not on PATH)" % engine, kind="launch_failed")
    except subprocess.TimeoutExpired:
        raise HostError("`%s %s` did not answer within %g s" % (engine, args[0], timeout))
    out, err = proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace").strip()
    if check and proc.returncode != 0:
        raise HostError("`%s %s` failed (exit %d): %s" % (engine, " ".join(args[:1]), proc.returncode,
                                                         err[-1500:] or "no output"), kind="launch_failed")
    return proc.returncode, out, err


def inspect(engine, name):
    """The engine's `inspect` record of container `name`, or None when there is none."""
    code, out, _ = _engine(engine, "container", "inspect", name, check=False)
    if code != 0:
        return None
    try:
        data = json.loads(out)
    except ValueError:
        return None
    return data[0] if isinstance(data, list) and data else None


def _pidns(pid):
    try:
        return os.stat("/proc/%d/ns/pid" % pid).st_ino
    except OSError:
        return None


def pids(ddir, server):
    """Host pids of every process in the container of `server` (server.json): those sharing its
    init's PID namespace, init included ([] when it does not run). nvidia-smi reports these."""
    info = inspect(server["runtime"], server["container"])
    init = ((info or {}).get("State") or {}).get("Pid") or 0
    ns = _pidns(init) if init else None
    if ns is None:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _pidns(int(entry)) == ns and pid_alive(int(entry)):
            out.append(int(entry))
    return sorted(out)


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _server_pid(init, deadline):
    """The server: the init's child (catatonit or docker-init forks it), once it exists."""
    while True:
        kids = _children(init)
        if kids or time.monotonic() >= deadline or not pid_alive(init):
            return kids[0] if kids else init
        time.sleep(0.01)


def _pgid(pid):
    """The server's process group (init puts it in its own): the preflight's "the port is ours"."""
    try:
        return os.getpgid(pid) if pid else None
    except OSError:
        return None


def _start(here, argv, env, spec):
    """Start release directory `here` in its container; returns the server record (server.json),
    or {"error", "rule", "fix"} when the engine refused (launch.py reports it like a failed exec)."""
    name, engine = spec["name"], spec["engine"]
    ddir = os.path.dirname(os.path.dirname(here))
    old = inspect(engine, name)
    if old is not None:
        labels = (old.get("Config") or {}).get("Labels") or {}
        if labels.get("llmfab.deploy_dir") != ddir:
            return {"error": "a container named %s exists and is not this deployment's (%s)" % (
                name, labels.get("llmfab.deploy_dir") or "not made by llmfab"), "rule": "container-name-taken",
                    "fix": "remove or rename that container (`%s rm %s`), or give this deployment "
                           "another [target] name" % (engine, name)}
        if (old.get("State") or {}).get("Running"):
            return {"error": "container %s still runs release %s" % (name, labels.get("llmfab.release")),
                    "rule": "container-running", "fix": "stop it first: fab stop"}
        _engine(engine, "rm", "--force", name)
    entry = os.path.join(here, ENTRY_FILE)
    with open(entry, "w") as f:
        f.write(ENTRY_SCRIPT)
    os.chmod(entry, 0o755)
    env_path = os.path.join(here, ENV_FILE)
    fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(env_file_text(env))
    try:
        os.unlink(os.path.join(here, ".container-started"))
    except FileNotFoundError:
        pass
    started_at = utc_iso()
    try:
        code, out, err = _engine(engine, *run_argv(spec, here, argv, env_path)[1:], check=False)
    finally:
        os.unlink(env_path)  # the engine keeps the environment with the container
    if code != 0:
        return {"error": "`%s run` of image %s failed (exit %d): %s" % (engine, spec["image"], code,
                                                                      err[-1500:] or "no output"),
                "rule": "container-run-failed", "fix": _run_fix(engine, spec["image"], err)}
    info = inspect(engine, name) or {}
    init = (info.get("State") or {}).get("Pid") or 0
    pid = _server_pid(init, time.monotonic() + FIND_SERVER_S) if init else 0
    return {"pid": pid, "pgid": _pgid(pid), "started_at": started_at, "release": os.path.basename(here),
            "port": spec["port"], "runtime": engine, "container": name,
            "container_id": (info.get("Id") or out.strip())[:12], "init_pid": init}


def _run_fix(engine, image, err):
    if re.search(r"image not known|No such image|manifest unknown|pull access denied|unable to find image",
                 err, re.I):
        return "the image %s is not on this host: put it there (`%s pull %s`, or `%s load`)" % (
            image, engine, image, engine)
    if "nvidia.com/gpu" in err or "CDI" in err or "could not select device driver" in err:
        return GPU_FIXES["cdi" if "nvidia.com/gpu" in err or "CDI" in err else "gpus"]
    return "run the engine's command by hand on the host to see why (%s run ... %s)" % (engine, image)


def inspect_state(server):
    """The container's {name, id, status, exit_code, restarts, running, pid} (status "missing"
    when the engine has no such container)."""
    info = inspect(server["runtime"], server["container"])
    if info is None:
        return {"name": server["container"], "status": "missing", "exit_code": None, "restarts": None,
                "running": False}
    st = info.get("State") or {}
    return {"name": server["container"], "id": (info.get("Id") or "")[:12], "status": st.get("Status"),
            "exit_code": st.get("ExitCode"), "restarts": info.get("RestartCount"),
            "running": bool(st.get("Running")), "init_pid": st.get("Pid") or None,
            "started_at": st.get("StartedAt"), "finished_at": st.get("FinishedAt")}


def alive(ddir, server):
    """Does the container of server.json run? When the engine restarted it, server.json is
    brought up to date with the new server's pid (status and the wait read it there). While
    the recorded server lives (its release's marker in its environment) the engine is not
    asked: the wait polls this many times a second."""
    pid = server.get("pid")
    if pid and pid_alive(pid) and release_marker(ddir, server.get("release")) in \
            (proc_read(pid, "environ") or b"").split(b"\0"):
        return True
    info = inspect(server["runtime"], server["container"])
    st = (info or {}).get("State") or {}
    labels = ((info or {}).get("Config") or {}).get("Labels") or {}
    if not st.get("Running") or labels.get("llmfab.release") != server.get("release"):
        return False
    init = st.get("Pid") or 0
    if init and init != server.get("init_pid"):
        pid = _server_pid(init, time.monotonic() + FIND_SERVER_S)
        write_json(os.path.join(ddir, "server.json"), dict(server, pid=pid, pgid=_pgid(pid), init_pid=init))
    return True


def returncode(exit_code):
    """A container's exit code as a Popen returncode: 128+N (the init's report of signal N) -> -N."""
    if exit_code is not None and 128 < exit_code < 128 + 65:
        return -(exit_code - 128)
    return exit_code


def _stop(ddir, server, grace):
    """The engine's stop with `grace` as its timeout (TERM to the init, which passes it on, then
    KILL); afterwards no process of the container is left. The answer has procs.stop's shape."""
    before = pids(ddir, server)
    if not before and not alive(ddir, server):
        return {"already_stopped": True, "server": server, "terminated": [], "killed": [], "survivors": []}
    names = {str(p): cmdline(p) for p in before}
    t0 = time.monotonic()
    _engine(server["runtime"], "stop", "--time", str(int(math.ceil(grace))), server["container"],
            timeout=grace + ENGINE_TIMEOUT_S)
    seconds = round(time.monotonic() - t0, 3)
    st = inspect_state(server)
    survivors = [p for p in before if pid_alive(p)]
    killed = before if st["exit_code"] == 137 else []
    rdir = os.path.join(ddir, "releases", server.get("release") or "")
    if os.path.isdir(rdir):
        write_json(os.path.join(rdir, "exit.json"), {"returncode": returncode(st["exit_code"]),
                                                     "ended_at": utc_iso(), "container": st})
    return {"already_stopped": False, "server": server, "terminated": [p for p in before if p not in killed],
            "killed": killed, "survivors": survivors, "names": names, "seconds": seconds}


def is_container(server):
    return bool(server) and server.get("runtime") in ENGINES and bool(server.get("container"))


# -- preflight --------------------------------------------------------------------------


def _rec(check, status, message):
    return {"check": check, "status": status, "message": message}


def _check(spec):
    """Preflight records: the engine answers (and its version), the image is on the host, the
    GPUs can reach a container. A FAIL names what is missing and how to get it."""
    engine = spec["engine"]
    if which(engine) is None:
        how = ("`apt-get install podman` (rootful; Debian/Ubuntu)" if engine == "podman" else
               "install Docker Engine (docs.docker.com/engine/install)")
        return [_rec("runtime", "FAIL", "[server] runtime = \"%s\": %s is not on this host's PATH; %s"
                     % (engine, engine, how))]
    code, out, err = _engine(engine, "info", "--format", "json", check=False)
    if code != 0:
        return [_rec("runtime", "FAIL", "%s does not answer (`%s info`, exit %d): %s" % (
            engine, engine, code, err[-600:] or "no output"))]
    try:
        info = json.loads(out)
    except ValueError:
        info = {}
    version = (info.get("version") or {}).get("Version") or info.get("ServerVersion") or "unknown version"
    out = [_rec("runtime", "OK", "%s %s answers" % (engine, version))]
    if _engine(engine, "image", "inspect", spec["image"], check=False)[0] != 0:
        out.append(_rec("runtime", "FAIL", "image %s is not on this host (llmfab never pulls): `%s pull %s` "
                        "(or `%s load` a saved one)" % (spec["image"], engine, spec["image"], engine)))
    out.append(_gpu_access(spec, info))
    return out


def _gpu_access(spec, info):
    mode = spec["gpus"]
    if mode == "none":
        return _rec("runtime", "OK", "no GPU passed to the container ([container] gpus = \"none\")")
    if mode == "cdi":
        found = []
        for d in CDI_DIRS:
            for f in sorted(os.listdir(d)) if os.path.isdir(d) else ():
                try:
                    with open(os.path.join(d, f), errors="replace") as fh:
                        if "nvidia.com" in fh.read():
                            found.append(os.path.join(d, f))
                except OSError:
                    continue
        if found:
            return _rec("runtime", "OK", "GPUs through CDI: %s" % ", ".join(found))
        return _rec("runtime", "FAIL", "no NVIDIA CDI spec under %s: the container cannot get the GPUs; %s"
                    % (" or ".join(CDI_DIRS), GPU_FIXES["cdi"]))
    runtimes = info.get("Runtimes") or {}
    hooks = [t for t in ("nvidia-container-runtime-hook", "nvidia-container-runtime", "nvidia-ctk") if which(t)]
    if "nvidia" in runtimes or hooks:
        return _rec("runtime", "OK", "GPUs through --gpus (%s)" % (", ".join(hooks) or "nvidia runtime"))
    return _rec("runtime", "FAIL", "--gpus needs the NVIDIA Container Toolkit, which this host lacks; %s"
                % GPU_FIXES["gpus"])


def probe_argv(spec, python, env_file):
    """`ENGINE run --rm` of the image's `python` with no network: how the preflight asks the image
    (not the host) which engine it has. The probe's own arguments follow."""
    out = [spec["engine"], "run", "--rm", "--network=none", "--env-file", env_file, "--entrypoint", python]
    for src, dst, ro in [tuple(m) for m in spec.get("mounts", ())]:
        out += ["--volume", "%s:%s%s" % (src, dst, ":ro" if ro else "")]
    return out + [spec["image"]]


def engine_probe(spec, engine, python, env):
    """engineid.probe(engine) run by the image's `python` in the image, with the profile's plain
    environment (an env file of mode 0600, removed afterwards): what the server will find."""
    import tempfile
    fd, path = tempfile.mkstemp(prefix="llmfab-probe-", suffix=".env")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(env_file_text({k: str(v) for k, v in (env or {}).items()}))
        return engineid.in_server_env(engine, python, {}, argv_prefix=probe_argv(spec, python, path))
    finally:
        os.unlink(path)


# -- the runtime contract (tasks/runtime/host/runtimes.py) ---------------------------------

def check(runtime_spec):
    """The preflight's runtime records for runtime_spec (tasks/runtime/container.py preflight)."""
    return _check(runtime_spec)


def launch(ddir, rpath, spec, python):
    """Start the release at rpath in its container (spec: runtime.json); writes server.json and
    returns its record. Only what the profile gives enters the container: launch.py's ENV, the
    engine's cache directories, the release's secrets (never the host's environment)."""
    code = release_launcher(rpath)
    env = dict(code.ENV, LLMFAB_RELEASE=rpath)
    for name, rel in code.CACHE_ENV.items():
        env[name] = os.path.join(ddir, rel)
        os.makedirs(env[name], exist_ok=True)
    if code.SECRET_NAMES:
        secrets = read_json(os.path.join(rpath, "secrets.json")) or {}
        env.update({k: secrets[k] for k in code.SECRET_NAMES if k in secrets})
    record = _start(rpath, list(code.ARGV), env, spec)
    if "error" in record:
        raise HostError(record["error"], rule=record.get("rule"), fix=record.get("fix"), line=record["error"])
    write_json(os.path.join(ddir, "server.json"), record)
    if spec.get("hang"):  # the hang watch beside the container, from the release's own llmfab_host
        subprocess.Popen([sys.executable, "-S", "-m", MODULE, "watch", rpath], cwd=rpath, start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return record


def _watch(here):
    """[supervise] hang_timeout beside a container: the supervisor's hang watch probes the
    server; one with no /health 200 for hang_timeout after ready (SIGSTOP, a deadlock) gets its
    container SIGKILLed, and the engine's restart policy starts it again (the watch arms again
    once the new start answers). Ends with the release: a stop, another release, the container
    gone or down for good."""
    from ...supervise.host.hangwatch import HangWatch, deploy_saw_ready
    spec = read_json(os.path.join(here, "runtime.json")) or {}
    cfg, engine, name = spec.get("hang"), spec.get("engine"), spec.get("name")
    ddir, release = os.path.dirname(os.path.dirname(here)), os.path.basename(here)
    hang, started, first, down_since = HangWatch(cfg), None, None, None
    while True:
        try:
            server = read_json(os.path.join(ddir, "server.json")) or {}
            stop = read_json(os.path.join(here, STOP_FILE)) or {}
        except Damaged:
            return 1
        if server.get("release") != release or (stop and stop.get("pid") == server.get("pid")):
            return 0
        info = inspect(engine, name)
        if info is None or (info.get("Config") or {}).get("Labels", {}).get("llmfab.release") != release:
            return 0
        st = info.get("State") or {}
        if not st.get("Running"):
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > WATCH_DOWN_S:
                return 0
            time.sleep(0.5)
            continue
        down_since = None
        if st.get("StartedAt") != started:  # a (re)start: watch it from its own first answer
            started, hang = st.get("StartedAt"), HangWatch(cfg)
            first = first or started
        time.sleep(hang.next_probe_in())
        if not hang.ready and started == first:  # the first start: ready as deploy saw it
            hang.armed_by(deploy_saw_ready(here, 0))
        why = hang.probe()
        if why:
            init = st.get("Pid") or 0
            with open(os.path.join(here, "server.log"), "a") as log:
                log.write("--- %s: SIGKILL to container %s (its init, pid %d), its restart policy starts "
                          "it again (%s)\n" % (why, name, init, utc_iso()))
            # the init from outside, not `podman kill`: podman applies no restart policy to a
            # container it was told to kill or stop
            if init:
                try:
                    os.kill(init, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            hang = HangWatch(cfg)


def state(ddir, server):
    """{"alive", "pid", "container": the engine's status, exit code, restarts}; "exit" too once
    it has ended (its exit code as a returncode). A restart by the engine is written to
    server.json (alive)."""
    running = alive(ddir, server)
    now = read_json(os.path.join(ddir, "server.json")) or server
    box = inspect_state(now)
    out = {"alive": running, "pid": now.get("pid"),
           "container": {k: box.get(k) for k in ("name", "id", "status", "exit_code", "restarts")}}
    if not running and box["status"] in ("exited", "stopped", "dead"):
        out["exit"] = {"returncode": returncode(box["exit_code"]), "ended_at": box.get("finished_at")}
    return out


def stop(ddir, server, grace, by):
    """The engine's stop (see _stop); `by` records the stop in the release first."""
    if by and alive(ddir, server):
        mark_stopped(ddir, server, by)
    return _stop(ddir, server, grace)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "watch":
        raise SystemExit("usage: python -m %s watch RELEASE_DIR" % MODULE)
    sys.exit(_watch(sys.argv[2]))
