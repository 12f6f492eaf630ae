"""The tasks `fab` shows, and the one error boundary of llmfab.

Each task parses its flags into a frozen options record (tasks/options.py) and hands it
to the module that holds that capability. Every llmfab error, from any module, becomes
its one-line message and exit code here (`_boundary`) and nowhere else. Imports of the
heavier modules happen inside the tasks so `fab --list` stays fast.
"""
import importlib

from invoke import task
from invoke.exceptions import Exit

from .errors import LlmfabError

PROFILE_HELP = "TOML deployment profile (default: config key llmfab.profile, else configs/demo.toml)"
COMMON = {
    "profile": PROFILE_HELP,
    "parallel": "at most this many hosts at once (default 32)",
    "accept-new-host-keys": "trust host keys not yet in known_hosts (default: refuse them)",
}


def _help(**extra):
    return dict(COMMON, **extra)


def _boundary(c, where, options, flags):
    """Parse `flags` into `options` (a tasks.options class) and run the body `where`
    ("module:function") with them; any LlmfabError becomes `error: <message>` + its exit code."""
    from . import options as options_module
    try:
        opts = getattr(options_module, options).from_flags(**flags)
        module, function = where.split(":")
        body = getattr(importlib.import_module(f".{module}", __package__), function)
        return body(c, opts)
    except LlmfabError as e:
        raise Exit(f"error: {e.message}" if e.message else None, code=int(e.code)) from None


@task(help=_help(**{
    "dry-run": "print the argv and launch.py that would be used; touch no host",
    "no-wait": "return once launched, without waiting for readiness",
    "timeout": "seconds to wait for readiness (default: the profile's ready.timeout)",
    "stop-on-timeout": "stop the server if it is not ready in time (default: leave it running)",
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
    "rolling": "N hosts at a time, each batch ready before the next; at the first failed host "
               "stop and put it back (default: the profile's target.rolling, else all at once)",
    "smoke": "a host counts as deployed once it also answered one 1-token completion",
}))
def deploy(c, profile=None, dry_run=False, no_wait=False, timeout=None, stop_on_timeout=False,
           json=False, rolling=None, smoke=False, parallel=32, accept_new_host_keys=False):
    """Validate, preflight, push a release, launch detached, wait until ready (or say why not)."""
    return _boundary(c, "deploy:deploy", "DeployOptions", locals())


@task(help=_help(**{
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
}))
def check(c, profile=None, json=False, parallel=32, accept_new_host_keys=False):
    """Validate the profile and run the whole preflight on the host(s); launch nothing."""
    return _boundary(c, "check:check", "CheckOptions", locals())


@task(help=_help(**{
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
}))
def status(c, profile=None, json=False, parallel=32, accept_new_host_keys=False):
    """Show per host: running?, pid, uptime, release, health, model, GPU memory, throughput."""
    return _boundary(c, "status:status", "StatusOptions", locals())


@task(help=_help(grace="seconds between SIGTERM and SIGKILL (default 30)"))
def stop(c, profile=None, grace=30.0, parallel=32, accept_new_host_keys=False):
    """Stop the server: SIGTERM its process group, wait, SIGKILL, sweep leftovers, check GPUs."""
    return _boundary(c, "stop:stop", "StopOptions", locals())


@task(help=_help(**{
    "lines": "how many lines from the end (default 50)",
    "follow": "keep streaming new lines until Ctrl-C; survives dropped connections",
    "grep": "only lines matching this regular expression",
    "release": "read an older release's log (a stamp from `fab releases`)",
}))
def tail_log(c, profile=None, lines=50, follow=False, grep=None, release=None, parallel=32,
             accept_new_host_keys=False):
    """Show the last lines of the current release's server.log; --follow streams it."""
    return _boundary(c, "logs:tail_log", "TailLogOptions", locals())


@task(help=_help(**{
    "json": "print one JSON object per host on stdout",
    "keep": "first prune to the newest N releases (never the current one or the one before it)",
}))
def releases(c, profile=None, json=False, keep=None, parallel=32, accept_new_host_keys=False):
    """List the releases kept on the host: stamp, profile hash, started, how it ended, log size."""
    return _boundary(c, "releases:releases", "ReleasesOptions", locals())


@task(help=_help(**{
    "timeout": "seconds to wait for readiness (default: the profile's ready.timeout)",
    "no-wait": "return once launched, without waiting for readiness",
    "json": "print one JSON object per host on stdout (a failed start: with `fatal`)",
}))
def rollback(c, profile=None, timeout=None, no_wait=False, json=False, parallel=32,
             accept_new_host_keys=False):
    """Stop the current release and relaunch the previous one exactly as it was."""
    return _boundary(c, "releases:rollback", "RollbackOptions", locals())


@task(help=_help(**{
    "gpus": "comma-separated GPU indices (default: the profile's gpu.devices, else all)",
    "all": "every GPU on the host, whatever the profile says",
    "grace": "seconds between SIGTERM and SIGKILL (default 10)",
    "dry-run": "list what would be killed (pid, user, command, GPU, MiB); kill nothing",
    "json": "print one JSON object per host on stdout",
}))
def kill_gpu_procs(c, profile=None, gpus=None, all=False, grace=10.0, dry_run=False, json=False,
                   parallel=32, accept_new_host_keys=False):
    """Free GPUs: find every process using them, TERM then KILL, verify the memory came back."""
    return _boundary(c, "gpu:kill_gpu_procs", "KillGpuProcsOptions", locals())


@task(help=_help(**{
    "requests": "measured requests, after one warm-up request (default 32)",
    "concurrency": "requests in flight at once (default 4)",
    "max-tokens": "max_tokens per request (default 128)",
    "prompts": "JSONL file of prompts ({\"prompt\": ...} or {\"messages\": [...]} per line)",
    "json": "print one JSON object per host on stdout",
    "compare": "print two saved --json results side by side: --compare A.json,B.json",
    "repeat": "run the bench N times; report each figure's median and spread (default 1)",
    "seed": "the order of the shipped prompts when --prompts is not given (default 0)",
}))
def bench(c, profile=None, requests=None, concurrency=None, max_tokens=None, prompts=None,
          json=False, compare=None, parallel=32, accept_new_host_keys=False, repeat=None,
          seed=None):
    """Load the running server through its OpenAI API: tokens/s, TTFT, ITL, spec acceptance."""
    # Numbers default to None (not 32/4/128) so Invoke passes them as text and a bad value
    # such as `--requests abc` becomes a one-line error with exit 2, not a traceback.
    return _boundary(c, "bench:bench", "BenchOptions", locals())


@task(help=_help(out="write it to this file, replaced in one rename (default: stdout)"))
def targets(c, profile=None, out=None, parallel=32, accept_new_host_keys=False):
    """Print a Prometheus file_sd document: the /metrics address of every running deployment."""
    return _boundary(c, "targets:targets", "TargetsOptions", locals())


@task(iterable=["vary"], help=_help(**{
    "vary": "KEY=V1,V2,...: a dotted key into the profile and its values; repeat the flag "
            "for more keys (the variants are the product), e.g. "
            "server.args.speculative-config.num_speculative_tokens=1,2,4",
    "profiles": "comma-separated profiles, each one more variant (deployed as this deployment)",
    "baseline": "one more variant: the profile with no speculative config",
    "concurrency": "comma-separated concurrencies to measure each variant at (default 1,8)",
    "requests": "measured requests per bench run, after one warm-up request (default 16)",
    "input-len": "lengthen each shipped prompt to about N words (default: as shipped)",
    "max-tokens": "max_tokens per request (default 128)",
    "repeat": "bench runs per variant and concurrency; their spread decides ties (default 3)",
    "seed": "the order of the shipped prompts; the same for every variant (default 0)",
    "objective": "tokens_per_s@C (most output tokens/s at concurrency C; default: the "
                 "largest C) or ttft_p90@C (lowest TTFT p90)",
    "keep": "previous (default): put back what ran before; winner: leave the winner running",
    "out": "directory for results.jsonl, report.html and <stem>.tuned.toml "
           "(default ./tune-<name>-<UTC stamp>/)",
    "resume": "continue the sweep in this directory: measure only what it lacks",
    "json": "print the result records and the decision as JSON Lines on stdout",
}))
def tune(c, profile=None, vary=None, profiles=None, baseline=False, concurrency=None,
         requests=None, input_len=None, max_tokens=None, repeat=None, seed=None,
         objective=None, keep=None, out=None, resume=None, json=False, parallel=32,
         accept_new_host_keys=False):
    """Deploy each speculative-decoding variant, bench it the same way, and name the fastest."""
    return _boundary(c, "tune.task:tune", "TuneOptions", locals())
