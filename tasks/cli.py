"""The tasks `fab` shows. Thin: each parses flags and hands over to a module.

Imports of the heavier modules happen inside the tasks so `fab --list` stays fast.
"""
from invoke import task

PROFILE_HELP = "TOML deployment profile (default: config key llmfab.profile, else configs/demo.toml)"
COMMON = {
    "profile": PROFILE_HELP,
    "parallel": "at most this many hosts at once (default 32)",
    "accept-new-host-keys": "trust host keys not yet in known_hosts (default: refuse them)",
}


def _help(**extra):
    return dict(COMMON, **extra)


@task(help=_help(**{
    "dry-run": "print the argv and launch.py that would be used; touch no host",
    "no-wait": "return once launched, without waiting for readiness",
    "timeout": "seconds to wait for readiness (default: the profile's ready.timeout)",
    "stop-on-timeout": "stop the server if it is not ready in time (default: leave it running)",
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
}))
def deploy(c, profile=None, dry_run=False, no_wait=False, timeout=None, stop_on_timeout=False,
           json=False, parallel=32, accept_new_host_keys=False):
    """Validate, preflight, push a release, launch detached, wait until ready (or say why not)."""
    from .commands import deploy as run
    run(c, locals())


@task(help=_help())
def check(c, profile=None, parallel=32, accept_new_host_keys=False):
    """Validate the profile and run the whole preflight on the host(s); launch nothing."""
    from .commands import check as run
    run(c, locals())


@task(help=_help(**{
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
}))
def status(c, profile=None, json=False, parallel=32, accept_new_host_keys=False):
    """Show per host: running?, pid, uptime, release, health, model, GPU memory, throughput."""
    from .commands import status as run
    run(c, locals())


@task(help=_help(grace="seconds between SIGTERM and SIGKILL (default 30)"))
def stop(c, profile=None, grace=30.0, parallel=32, accept_new_host_keys=False):
    """Stop the server: SIGTERM its process group, wait, SIGKILL, sweep leftovers, check GPUs."""
    from .commands import stop as run
    run(c, locals())
