"""runtime = "systemd": one unit per deployment, run by the host's own systemd.

The unit (llmfab-<deployment>.service, /etc/systemd/system for root, else the user's
manager) runs the release exactly as llmfab's launcher would, with no shell in between:

    ExecStartPre=PYTHON -S -m llmfab_host.runtime.host.systemd_unit wait-gpu RELEASE_DIR
    ExecStart=PYTHON -S -m llmfab_host.runtime.host.systemd_unit exec RELEASE_DIR
    ExecStopPost=PYTHON -S -m llmfab_host.runtime.host.systemd_unit exited RELEASE_DIR
    ExecStartPost=PYTHON -S -m llmfab_host.runtime.host.systemd_unit watch RELEASE_DIR   (hang_timeout)

in the release directory (WorkingDirectory=; the release carries llmfab_host). `exec` reads
the argv from the release's launch.py (the same ARGV list, never re-quoted), adds the
release marker and the engine's cache directory to the environment systemd gave it
([server.env] and secrets, from the release's server.env, mode 0600), checks that
environment against launch.py's, records server.json with its own pid, and execs the server:
the unit's main pid IS the server. `wait-gpu` holds every (re)start until the deployment's
GPUs are back to the baseline recorded before the deploy; `exited` writes exit.json, as the
launcher's reaper does, so the failure explainer reads the same facts. Output goes to the
release's server.log (StandardOutput=append:), where tail-log, the explainer and the start-up
profile read it. Restart=, RestartSec= and StartLimitBurst= come from [supervise]; with its
hang_timeout, `watch` runs the supervisor's hang watch beside the server and SIGKILLs a hung
one, for Restart= to start again (systemd's WatchdogSec= needs sd_notify from the server, which
no engine sends). A release or
a rollback rewrites the unit for its release directory; stop is `systemctl stop` with the
grace as TimeoutStopSec. The unit's cgroup is the deployment's identity (`pids`).
"""
import os
import shutil
import signal
import subprocess
import sys
import time

from ...release.host.release_dirs import release_launcher
from ...base.host.hosterrors import HostError
from ...base.host.layout import mark_stopped
from ...base.host.procfs import cmdline, pid_alive
from ...base.host.statefiles import read_json, utc_iso, write_atomically, write_json
from ...gpu.host.nvsmi import NVIDIA_SMI, baseline_limits, gpus_over
from .runtimes import server_alive

SYSTEM_UNIT_DIR = "/etc/systemd/system"
SYSTEMCTL_TIMEOUT_S = 30
EXEC_WAIT_S = 15.0  # systemctl start returns once our `exec` runs; then the server's exec follows
LAUNCH_ERROR = "launch-error.json"  # in the release: the server's exec failed (errno, argv0)
ENV_FILE = "server.env"
MODULE = "llmfab_host.runtime.host.systemd_unit"
STATE_PROPS = ("ActiveState", "SubState", "NRestarts", "MainPID", "Result", "ExecMainStatus",
               "UnitFileState", "LoadState", "ControlGroup")


# -- unit file syntax (systemd.syntax(7), systemd.service(7) "Command lines") ------------------

def exec_word(word):
    """One argv word for ExecStart=: double-quoted, C escapes for \\ and ", % as %% (specifiers)
    and $ as $$ (variable expansion): systemd hands the program exactly `word`."""
    if any(c in word for c in "\n\r\0"):
        raise HostError("%r cannot be a word of a unit's command line (newline or NUL)" % word)
    return '"%s"' % word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")


def exec_line(argv):
    return " ".join(exec_word(w) for w in argv)


def path_value(path):
    """A path as a unit setting's value (WorkingDirectory=, EnvironmentFile=, append:): only
    specifiers expand there, so % becomes %%."""
    if any(c in path for c in "\n\r\0"):
        raise HostError("%r cannot be a path in a unit file (newline or NUL)" % path)
    return path.replace("%", "%%")


def env_line(name, value):
    """NAME="value" for an EnvironmentFile=: inside double quotes \\, ", ` and $ are escaped;
    other characters, newlines included, are taken as they are."""
    escaped = "".join("\\" + c if c in '\\"`$' else c for c in value)
    return '%s="%s"\n' % (name, escaped)


def unit_name(ddir):
    return "llmfab-%s.service" % os.path.basename(ddir.rstrip("/"))


def unit_text(ddir, rpath, spec, python):
    """The unit file for the release at rpath; `spec` its runtime.json."""
    run = [python, "-S", "-m", MODULE]
    restart = spec.get("restart") or "no"
    lines = [
        "# llmfab deployment %s (%s): written by fab deploy / rollback for release %s." % (
            os.path.basename(ddir), ddir, os.path.basename(rpath)),
        "# Rewritten at each launch; edit the profile, not this file.",
        "[Unit]",
        "Description=llmfab %s (release %s)" % (os.path.basename(ddir), os.path.basename(rpath)),
        "After=network.target",
        "StartLimitIntervalSec=%d" % max(1, int(spec.get("window") or 600)),
        "StartLimitBurst=%d" % (int(spec.get("max_restarts", 5)) + 1),
        "",
        "[Service]",
        "Type=exec",
        "WorkingDirectory=%s" % path_value(rpath),
        "EnvironmentFile=%s" % path_value(os.path.join(rpath, ENV_FILE)),
        "ExecStartPre=%s" % exec_line(run + ["wait-gpu", rpath]),
        "ExecStart=%s" % exec_line(run + ["exec", rpath]),
    ] + (["ExecStartPost=%s" % exec_line(run + ["watch", rpath])] if spec.get("hang") else []) + [
        "ExecStopPost=%s" % exec_line(run + ["exited", rpath]),
        "StandardInput=null",
        "StandardOutput=append:%s" % path_value(os.path.join(rpath, "server.log")),
        "StandardError=inherit",
        "Restart=%s" % restart,
        "RestartSec=%g" % float(spec.get("backoff") or 0),
        "KillMode=control-group",
        "TimeoutStartSec=%d" % int(float(spec.get("memory_timeout") or 120) + 30),
        "TimeoutStopSec=%g" % float(spec.get("grace") or 30),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


# -- systemctl -------------------------------------------------------------------------------

def _user_mode():
    return os.geteuid() != 0


def unit_dir():
    if not _user_mode():
        return SYSTEM_UNIT_DIR
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "systemd", "user")


def systemctl(*args, check=True):
    argv = ["systemctl"] + (["--user"] if _user_mode() else []) + ["--no-ask-password"] + list(args)
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=SYSTEMCTL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostError("%s: %s" % (" ".join(argv), e), rule="runtime-failed")
    out = proc.stdout.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise HostError("%s failed (exit %d): %s" % (" ".join(argv), proc.returncode, err or out.strip()),
                        rule="runtime-failed")
    return proc.returncode, out


def show(unit):
    """{property: value} of `systemctl show`; {} when systemctl cannot answer."""
    try:
        _, out = systemctl("show", unit, "-p", ",".join(STATE_PROPS), check=False)
    except HostError:
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# -- the host contract (tasks/runtime/host/runtimes.py) ---------------------------------------

def check(runtime_spec):
    """systemd is PID 1, answers, and is new enough for the unit llmfab writes (and, with
    runtime_spec's `enable`, starts at boot)."""
    def rec(status, message, fix=None):
        return {"check": "runtime", "status": status, "message": message + ("; fix: %s" % fix if fix else ""),
                "fix": fix}
    try:
        with open("/proc/1/comm") as f:
            init = f.read().strip()
    except OSError:
        init = "?"
    if init != "systemd" or not os.path.isdir("/run/systemd/system"):
        return [rec("FAIL", 'runtime = "systemd", but PID 1 on this host is %s, not systemd' % init,
                    'boot the host with systemd, or set [server] runtime = "process"')]
    if shutil.which("systemctl") is None:
        return [rec("FAIL", "systemctl is not on the PATH", "install systemd's systemctl")]
    try:
        _, state = systemctl("is-system-running", check=False)
        _, version = systemctl("--version")
    except HostError as e:
        return [rec("FAIL", "systemctl does not answer: %s" % e, "check `systemctl status` on the host")]
    words = version.split()
    number = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    state = state.strip() or "unknown"
    if number < 240:  # Type=exec and StandardOutput=append: came in systemd 240
        return [rec("FAIL", "systemd %d is too old (the unit needs Type=exec and StandardOutput=append:, "
                            "systemd >= 240)" % number, 'upgrade systemd or use runtime = "process"')]
    if state in ("offline", "unknown", "stopping"):
        return [rec("FAIL", "systemd %d answers %s" % (number, state), "check `systemctl status` on the host")]
    where = "the user's manager (%s)" % unit_dir() if _user_mode() else "the system manager"
    out = [rec("OK" if state in ("running", "degraded", "starting", "initializing") else "WARN",
               "systemd %d is PID 1 (%s), units in %s" % (number, state, where))]
    if _user_mode() and runtime_spec.get("enable"):
        user = os.environ.get("USER") or str(os.geteuid())
        if not os.path.exists("/var/lib/systemd/linger/%s" % user):
            out.append(rec("WARN", "[systemd] enable = true, but %s has no lingering user manager: the "
                                   "unit starts at the user's next login, not at boot" % user,
                           "run `loginctl enable-linger %s` on the host (as root)" % user))
    return out


def _write_unit(ddir, rpath, spec, python):
    name = unit_name(ddir)
    path = os.path.join(unit_dir(), name)
    old = _read(path)
    if old and "(%s)" % ddir not in old.splitlines()[0]:
        raise HostError("%s belongs to another deployment (%s)" % (path, old.splitlines()[0]),
                        rule="runtime-failed", fix="give this deployment another [target] name")
    os.makedirs(unit_dir(), exist_ok=True)
    text = unit_text(ddir, rpath, spec, python)
    if text != old:
        write_atomically(path, text, 0o644)  # no secret in it: those are in server.env (0600)
        systemctl("daemon-reload")
    return name


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write_env(rpath):
    """server.env (0600): launch.py's ENV and the release's secrets, as systemd reads them."""
    launcher = release_launcher(rpath)
    env = dict(launcher.ENV)
    if launcher.SECRET_NAMES:
        secrets = read_json(os.path.join(rpath, "secrets.json")) or {}
        env.update({k: secrets[k] for k in launcher.SECRET_NAMES if k in secrets})
    write_atomically(os.path.join(rpath, ENV_FILE), "".join(env_line(k, str(v)) for k, v in env.items()), 0o600)


def launch(ddir, rpath, spec, python):
    """Write the unit for this release, (re)start it, and wait until the server's exec is done."""
    python = python if os.path.isabs(python) else (shutil.which(python) or python)
    for name in (LAUNCH_ERROR, "exit.json"):
        if os.path.exists(os.path.join(rpath, name)):
            os.remove(os.path.join(rpath, name))
    _write_env(rpath)
    name = _write_unit(ddir, rpath, spec, python)
    systemctl("reset-failed", name, check=False)  # a failed unit's start limit would refuse the start
    systemctl("enable" if spec.get("enable") else "disable", name, check=False)
    t0 = time.monotonic()
    systemctl("restart", "--no-block", name)  # returns at once: wait-gpu may hold the start a while
    return _started(ddir, rpath, name, t0, float(spec.get("memory_timeout") or 120) + EXEC_WAIT_S)


def _started(ddir, rpath, name, t0, timeout):
    """The server record once the unit's main process is the server (its exec done)."""
    release = os.path.basename(rpath)
    while True:
        err = read_json(os.path.join(rpath, LAUNCH_ERROR))
        if err:
            from ...release.host.launch import exec_failure
            rule, cause, fix = exec_failure(err)
            raise HostError(cause, rule=rule, fix=fix, line=err.get("error"))
        record = read_json(os.path.join(ddir, "server.json")) or {}
        if record.get("release") == release and record.get("unit") == name and server_alive(ddir, record):
            return record
        props = show(name)
        if props.get("ActiveState") == "failed" or (
                props.get("ActiveState") == "inactive" and time.monotonic() - t0 > 3.0):
            # ended already: the wait reads its exit (exit.json) and log like any dead server
            if record.get("release") == release:
                return record
            raise HostError("unit %s did not start (%s, result %s); see `journalctl -u %s`" % (
                name, props.get("ActiveState"), props.get("Result"), name), rule="runtime-failed")
        if time.monotonic() - t0 > timeout:
            raise HostError("unit %s started no server within %g s (%s)" % (name, timeout, props.get(
                "SubState")), rule="runtime-failed")
        time.sleep(0.05)


def state(ddir, server):
    props = show(server.get("unit") or unit_name(ddir))
    pid = int(props.get("MainPID") or 0) or None
    unit = {"name": server.get("unit") or unit_name(ddir), "ActiveState": props.get("ActiveState"),
            "SubState": props.get("SubState"), "NRestarts": int(props.get("NRestarts") or 0),
            "Result": props.get("Result"), "UnitFileState": props.get("UnitFileState")}
    alive = bool(pid) and pid_alive(pid) and props.get("ActiveState") in ("active", "deactivating", "reloading")
    return {"alive": alive, "pid": pid, "unit": unit}


def pids(ddir, server):
    """Every pid in the unit's cgroup (recursively): the deployment's processes."""
    cgroup = show(server.get("unit") or unit_name(ddir)).get("ControlGroup") or ""
    if not cgroup:
        return []
    out = set()
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        top = root + cgroup
        if not os.path.isdir(top):
            continue
        for here, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(here, "cgroup.procs")) as f:
                        out.update(int(x) for x in f.read().split())
                except (OSError, ValueError):
                    pass
        if out:
            break
    return sorted(p for p in out if pid_alive(p))


def stop(ddir, server, grace, by):
    """systemctl stop with `grace` as TimeoutStopSec (SIGTERM to the whole cgroup, SIGKILL after
    it); the unit is disabled too, so a stopped deployment stays stopped after a reboot."""
    name = server.get("unit") or unit_name(ddir)
    before = pids(ddir, server)
    if not before and show(name).get("ActiveState") not in ("active", "activating", "deactivating"):
        systemctl("disable", name, check=False)
        return {"already_stopped": True, "server": server, "terminated": [], "killed": [], "survivors": []}
    names = {str(p): cmdline(p) for p in before}
    mark_stopped(ddir, server, by)
    _stop_timeout(name, grace)
    t0 = time.monotonic()
    systemctl("stop", name, check=False)
    seconds = time.monotonic() - t0
    systemctl("disable", name, check=False)
    left = pids(ddir, server)
    killed = [p for p in before if seconds >= grace]  # systemd sent SIGKILL once the grace ran out
    return {"already_stopped": False, "server": server, "unit": name,
            "terminated": [p for p in before if p not in killed], "killed": killed,
            "survivors": left, "names": names, "seconds": round(seconds, 3)}


def _stop_timeout(name, grace):
    """TimeoutStopSec for this stop: a runtime drop-in when it differs from the unit's."""
    dropin = os.path.join("/run/systemd/system" if not _user_mode() else os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/run/user/%d" % os.geteuid(), "systemd", "user"), name + ".d")
    path = os.path.join(dropin, "llmfab-stop.conf")
    text = "[Service]\nTimeoutStopSec=%g\n" % grace
    if _read(path) == text:
        return
    os.makedirs(dropin, exist_ok=True)
    write_atomically(path, text, 0o644)
    systemctl("daemon-reload")


# -- inside the unit (python -m llmfab_host.runtime.host.systemd_unit MODE) ----------------------

def _exec_server(here):
    """ExecStart: record server.json, then become the server (exec, no shell, same argv)."""
    launcher = release_launcher(here)
    env = dict(os.environ)
    for k in ("INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"):  # systemd's, not the server's
        env.pop(k, None)
    wrong = [k for k, v in launcher.ENV.items() if env.get(k) != v]
    if wrong:  # server.env did not give back what launch.py holds: never start with another value
        sys.stderr.write("llmfab: the unit's environment differs from launch.py's for %s\n" % ", ".join(wrong))
        return 1
    env["LLMFAB_RELEASE"] = here
    ddir = os.path.dirname(os.path.dirname(here))
    for name, rel in launcher.CACHE_ENV.items():
        env[name] = os.path.join(ddir, rel)
        os.makedirs(env[name], exist_ok=True)
    spec = read_json(os.path.join(here, "runtime.json")) or {}
    write_json(os.path.join(ddir, "server.json"), {
        "pid": os.getpid(), "pgid": os.getpgid(0), "started_at": utc_iso(), "release": os.path.basename(here),
        "port": launcher.PORT, "runtime": "systemd", "unit": spec.get("unit") or unit_name(ddir)})
    argv = list(launcher.ARGV)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        write_json(os.path.join(here, LAUNCH_ERROR), {"error": "cannot start %s: %s" % (argv[0], e.strerror),
                                                      "errno": e.errno, "argv0": argv[0]})
        sys.stderr.write("llmfab: cannot start %s: %s\n" % (argv[0], e.strerror))
        return 127


def _wait_gpu(here):
    """ExecStartPre: wait until the deployment's GPUs are back to gpu-baseline.json (a restart
    after a crash must not start while the dead server's memory is still held)."""
    baseline = read_json(os.path.join(here, "gpu-baseline.json")) or {}
    spec = read_json(os.path.join(here, "runtime.json")) or {}
    limits, smi = baseline_limits(baseline), baseline.get("nvidia_smi") or NVIDIA_SMI
    if not limits:
        return 0
    timeout = float(spec.get("memory_timeout") or 120)
    deadline = time.monotonic() + timeout
    said = False
    while True:
        over = gpus_over(smi, limits)
        if over is not None and not over:
            return 0
        if not said:
            sys.stderr.write("llmfab: waiting for the GPU memory to come back to the baseline: %s\n" % "; ".join(
                "GPU %d uses %s MiB (limit %d MiB)" % (g, m, limits[g]) for g, m in over or ()))
            sys.stderr.flush()
            said = True
        if time.monotonic() >= deadline:
            sys.stderr.write("llmfab: GPU memory not back to the baseline after %.0f s\n" % timeout)
            return 1
        time.sleep(0.25)


def _exited(here):
    """ExecStopPost: exit.json as the launcher's reaper writes it (returncode, or -signal)."""
    code, status = os.environ.get("EXIT_CODE"), os.environ.get("EXIT_STATUS") or ""
    if code is None or (os.environ.get("SERVICE_RESULT") == "success" and not status):
        return 0  # the start never got as far as the server
    if code == "exited":
        returncode = int(status) if status.lstrip("-").isdigit() else 1
    else:  # killed or dumped: a signal name (TERM, KILL, ...)
        sig = getattr(signal, "SIG" + status, None)
        returncode = -int(sig) if sig is not None else -9
    server = read_json(os.path.join(os.path.dirname(os.path.dirname(here)), "server.json")) or {}
    pid = server.get("pid") if server.get("release") == os.path.basename(here) else None
    write_json(os.path.join(here, "exit.json"), {"returncode": returncode, "ended_at": utc_iso(), "pid": pid})
    return 0


def _watch(here):
    """ExecStartPost (with [supervise] hang_timeout): the supervisor's hang watch for this
    start, forked off so the start completes; it stays in the unit's cgroup (systemd ends it
    with the unit). A server with no /health 200 for hang_timeout after ready (SIGSTOP, a
    deadlock) gets SIGCONT and SIGKILL: systemd's Restart= starts it again, after wait-gpu."""
    from ...startup.host.phases import process_started
    from ...supervise.host.hangwatch import HangWatch, deploy_saw_ready
    cfg = (read_json(os.path.join(here, "runtime.json")) or {}).get("hang")
    pid = int(os.environ.get("MAINPID") or 0)
    if not cfg or not pid or os.fork():
        return 0
    os.setsid()
    started = process_started(pid) or 0
    hang = HangWatch(cfg)
    while pid_alive(pid):
        time.sleep(hang.next_probe_in())
        if not hang.ready:  # ready as deploy saw this start (a SIGSTOP before the watch's first 200)
            hang.armed_by(deploy_saw_ready(here, started))
        why = hang.probe()
        if why and pid_alive(pid):
            with open(os.path.join(here, "server.log"), "a") as log:
                log.write("--- %s: SIGKILL to pid %d, systemd restarts it (%s)\n" % (why, pid, utc_iso()))
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
            return 0
    return 0


MODES = {"exec": _exec_server, "wait-gpu": _wait_gpu, "exited": _exited, "watch": _watch}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in MODES:
        raise SystemExit("usage: python -m %s {%s} RELEASE_DIR" % (MODULE, "|".join(MODES)))
    sys.exit(MODES[sys.argv[1]](sys.argv[2]))
