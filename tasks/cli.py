"""The tasks `fab` shows, and the one error boundary of llmfab.

COMMANDS below is every task in one table (pip's CommandInfo): the module and function
that hold its body, the options record its flags are parsed into (tasks/options.py) and
the one-line summary `fab --list` shows. Bodies are imported through the table only when
their task runs, so `fab --list` stays fast. The task functions under it declare the
flags Invoke parses (their signatures) and each flag's help; each hands its flags to
`_boundary`, where every llmfab error, from any module, becomes its one-line message and
exit code, and nowhere else.
"""
import importlib
from collections import namedtuple

from invoke import Task, task
from invoke.exceptions import Exit
from invoke.parser import ParserContext

from .errors import LlmfabError
from .interrupts import early_words, exit_status

CommandInfo = namedtuple("CommandInfo", "module function options summary")

# task name (as `fab` spells it) -> where it lives. A new task: a row here and a function below.
COMMANDS = {
    "deploy": CommandInfo(
        "deploy", "deploy", "options.DeployOptions",
        "Validate, preflight, push a release, launch detached, wait until ready (or say why not)."),
    "check": CommandInfo(
        "check", "check", "options.CheckOptions",
        "Validate the profile and run the whole preflight on the host(s); launch nothing."),
    "status": CommandInfo(
        "status", "status", "options.StatusOptions",
        "Show per host: running?, pid, uptime, release, health, model, GPU memory, throughput."),
    "stop": CommandInfo(
        "stop", "stop", "options.StopOptions",
        "Stop the server: SIGTERM its process group, wait, SIGKILL, sweep leftovers, check GPUs."),
    "tail-log": CommandInfo(
        "tail_log", "tail_log", "options.TailLogOptions",
        "Show the last lines of the current release's server.log; --follow streams it."),
    "releases": CommandInfo(
        "releases", "releases", "options.ReleasesOptions",
        "List the releases kept on the host: stamp, profile hash, started, how it ended, log size."),
    "rollback": CommandInfo(
        "releases", "rollback", "options.RollbackOptions",
        "Stop the current release and relaunch the previous one exactly as it was (an endpoint: each "
        "member back to the release in its other slot, a wake and a switch where it is parked)."),
    "kill-gpu-procs": CommandInfo(
        "kill_gpu_procs", "kill_gpu_procs", "options.KillGpuProcsOptions",
        "Free GPUs: find every process using them, TERM then KILL, verify the memory came back."),
    "bench": CommandInfo(
        "bench", "bench", "options.BenchOptions",
        "Load the running server through its OpenAI API: tokens/s, TTFT, ITL, spec acceptance."),
    "targets": CommandInfo(
        "targets", "targets", "options.TargetsOptions",
        "Print a Prometheus file_sd document: the /metrics address of every running deployment."),
    "pull": CommandInfo(
        "weights.pull", "pull", "options.PullOptions",
        "Copy the [weights] sources onto every host, verified (size, sha256); hosts feed each other."),
    "sleep": CommandInfo(
        "endpoint.commands", "sleep", "options.ParkOptions",
        "Park endpoint members: vLLM sleep mode level 1, GPU memory given back; a request wakes them."),
    "wake": CommandInfo(
        "endpoint.commands", "wake", "options.ParkOptions",
        "Wake parked endpoint members; traffic returns once a known greedy completion matches."),
    "tune": CommandInfo(
        "tune.task", "tune", "tune.sweep_options.TuneOptions",
        "Deploy each speculative-decoding variant, bench it the same way, and name the fastest."),
}

PROFILE_HELP = "TOML deployment profile (default: config key llmfab.profile, else configs/demo.toml)"
COMMON = {
    "profile": PROFILE_HELP,
    "parallel": "at most this many hosts at once",
    "accept-new-host-keys": "trust host keys not yet in known_hosts (default: refuse them)",
}


# Short flags: one letter means one flag in every task, and none is a letter Fabric's core
# options take (`fab --help`: -c -d -D -e -f -F -h -H -i -l -p -r -R -S -t -T -V -w), which
# would read differently before and after the task name. Every other flag is long-only
# (Invoke would otherwise give each flag the first free letter of its name, task by task).
SHORT_FLAGS = {"json": "j", "dry-run": "n", "vary": "v"}


class _Task(Task):
    """An Invoke task whose flags take their short form from SHORT_FLAGS only."""

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(opts["names"][0])
        if short:
            opts["names"].append(short)
        return opts


class _TaskHelp(ParserContext):
    """A task's flags as `fab --help TASK` shows them: the value each takes (`--parallel=INT`,
    not Invoke's STRING for a flag whose default is None) and its number default, both from the
    task's options record (tasks/options.py flag_help)."""

    def help_for(self, flag):
        spec, text = super().help_for(flag)
        arg = self.flags[flag]
        info = COMMANDS.get(self.name)
        if info is None or arg.kind is bool:
            return spec, text
        from .options import flag_help
        metavar, default = flag_help(options_class(info), arg.attr_name or arg.name, self.name)
        if metavar:  # -v KEY=V1,V2, --vary=KEY=V1,V2 (Invoke writes STRING, or nothing for a list)
            spec = ", ".join(sorted((n + (" " if len(n.strip("-")) == 1 else "=") + metavar
                                     for n in self.names_for(flag)), key=len))
        if default is not None:
            text = f"{text} (default {default})" if text else f"default {default}"
        return spec, text


def task_contexts(collection, ignore_unknown_help=None):
    """Invoke's Collection.to_contexts, with _TaskHelp contexts (the program's parser is made
    of these: tasks/fleet/executor.py)."""
    return [_TaskHelp(name=primary, aliases=aliases,
                      args=collection[primary].get_arguments(ignore_unknown_help=ignore_unknown_help))
            for primary, aliases in collection.task_names.items()]


def command(iterable=(), **flag_help):
    """@task for the function of the same name in COMMANDS: its summary is the docstring
    (`fab --list`, `fab --help TASK`), `flag_help` plus COMMON the help of each flag;
    `iterable`: flags that may be given several times (a list)."""
    def wrap(function):
        function.__doc__ = COMMANDS[function.__name__.replace("_", "-")].summary
        return task(help=dict(COMMON, **flag_help), iterable=list(iterable), klass=_Task,
                    auto_shortflags=False)(function)
    return wrap


def options_class(info):
    """The frozen options record of a COMMANDS row ("options.DeployOptions": tasks/options.py)."""
    module, _, name = info.options.rpartition(".")
    return getattr(importlib.import_module(f".{module}", __package__), name)


# Tasks that, given an endpoint profile ([endpoint] members = [...]), run on its members and router.
ENDPOINT_AWARE = ("deploy", "status", "stop", "tail-log", "bench", "sleep", "wake", "check",
                  "releases", "rollback", "kill-gpu-procs", "targets", "tune", "pull")


def _boundary(c, name, flags):
    """Parse `flags` into task `name`'s options record and run its body with them; any
    LlmfabError becomes `error: <message>` and its exit code."""
    info = COMMANDS[name]
    try:
        opts = options_class(info).from_flags(**flags)
        if name in ENDPOINT_AWARE:  # an endpoint profile: its members and router (tasks/endpoint/)
            from .endpoint.commands import dispatch
            done = dispatch(c, name, opts)
            if done is not None:
                return done
        body = getattr(importlib.import_module(f".{info.module}", __package__), info.function)
        return body(c, opts)
    except LlmfabError as e:  # a message may quote a server's text: made safe for a terminal;
        # an interrupted run's 130 is 128 + the signal that ended it
        from .output import terminal_lines
        raise Exit(terminal_lines(f"error: {e.message}") if e.message else None,
                   code=exit_status(int(e.code))) from None
    except OSError as e:  # a local file that could not be written or read: its path, in words
        words = file_error_words(e)
        if words is None:
            raise
        raise Exit(f"error: {words}", code=1) from None
    except KeyboardInterrupt:  # Ctrl-C (SIGTERM, SIGHUP) before any host (tasks/interrupts.py: after)
        raise Exit(early_words(), code=exit_status()) from None


def file_error_words(e):
    """An OSError naming a file, in words (`could not write /x: read-only file system ...`);
    None for one that names none (a bug, shown as one)."""
    from .base.host.safefile import UnsafeFile, failed
    if isinstance(e, UnsafeFile):
        return str(e)
    if not e.filename:
        return None
    return str(failed(e.filename, e, "use"))


@command(**{
    "dry-run": "print the argv and launch.py that would be used; touch no host",
    "no-wait": "return once launched, without waiting for readiness",
    "timeout": "seconds to wait for readiness (default: the profile's ready.timeout)",
    "stop-on-timeout": "stop the server if it is not ready in time (default: leave it running)",
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
    "rolling": "N hosts at a time, each batch ready before the next; at the first failed host "
               "stop and put it back (default: the profile's target.rolling, else all at once)",
    "smoke": "a host counts as deployed once it also answered one 1-token completion",
    "no-restore": "if the new release fails to start after the running one was stopped, leave "
                  "it stopped (default: put the running one back)",
})
def deploy(c, profile=None, dry_run=False, no_wait=False, timeout=None, stop_on_timeout=False,
           json=False, rolling=None, smoke=False, no_restore=False, parallel=None,
           accept_new_host_keys=False):
    return _boundary(c, "deploy", locals())


@command(json="print one JSON object per host on stdout (human text goes to stderr)")
def check(c, profile=None, json=False, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "check", locals())


@command(json="print one JSON object per host on stdout (human text goes to stderr)")
def status(c, profile=None, json=False, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "status", locals())


@command(grace="seconds between SIGTERM and SIGKILL",
         json="print one JSON object per host on stdout (human text goes to stderr)")
def stop(c, profile=None, grace=None, json=False, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "stop", locals())


@command(**{
    "lines": "how many lines from the end",
    "follow": "keep streaming new lines until Ctrl-C; survives dropped connections",
    "grep": "only lines matching this regular expression",
    "release": "read an older release's log (a stamp from `fab releases`)",
    "raw": "write each line as the server wrote it (default: control characters such as "
           "ESC are shown escaped, lines over 4096 characters cut)",
})
def tail_log(c, profile=None, lines=None, follow=False, grep=None, release=None, raw=False,
             parallel=None, accept_new_host_keys=False):
    return _boundary(c, "tail-log", locals())


@command(**{
    "json": "print one JSON object per host on stdout",
    "keep": "first prune to the newest N releases (never the current one or the one before it)",
})
def releases(c, profile=None, json=False, keep=None, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "releases", locals())


@command(**{
    "timeout": "seconds to wait for readiness (default: the profile's ready.timeout)",
    "no-wait": "return once launched, without waiting for readiness",
    "json": "print one JSON object per host on stdout (a failed start: with `fatal`)",
    "release": "relaunch this release (a stamp from `fab releases`) instead of the one before "
               "`current`, e.g. the one an interrupted deploy stopped",
    "member": "an endpoint profile: only this member (its target.name; default: every member)",
})
def rollback(c, profile=None, timeout=None, no_wait=False, json=False, release=None, member=None,
             parallel=None, accept_new_host_keys=False):
    return _boundary(c, "rollback", locals())


@command(**{
    "gpus": "comma-separated GPU indices (default: the profile's gpu.devices, else all)",
    "all": "every GPU on the host, whatever the profile says",
    "grace": "seconds between SIGTERM and SIGKILL",
    "dry-run": "list what would be killed (pid, user, command, GPU, MiB); kill nothing",
    "json": "print one JSON object per host on stdout",
})
def kill_gpu_procs(c, profile=None, gpus=None, all=False, grace=None, dry_run=False, json=False,
                   parallel=None, accept_new_host_keys=False):
    return _boundary(c, "kill-gpu-procs", locals())


@command(**{
    "requests": "measured requests, after one warm-up request",
    "concurrency": "requests in flight at once",
    "max-tokens": "max_tokens per request",
    "prompts": "JSONL file of prompts ({\"prompt\": ...} or {\"messages\": [...]} per line)",
    "json": "print one JSON object per host on stdout",
    "compare": "print two saved --json results side by side: --compare A.json,B.json",
    "repeat": "run the bench N times; report each figure's median and spread",
    "seed": "the order of the shipped prompts when --prompts is not given, or the random "
            "token ids of --random-input-len",
    "temperature": "sampling temperature sent with every request, e.g. 0 for greedy as "
                   "`fab tune` measures (default: the server's)",
    "random-input-len": "prompts of exactly N random token ids from the model's tokenizer.json "
                        "on the host (vLLM's `bench serve --dataset-name random`; acceptance "
                        "on them means nothing)",
    "ignore-eos": "ask the server to ignore end-of-sequence: every request generates "
                  "--max-tokens tokens (vLLM and SGLang's ignore_eos)",
})
def bench(c, profile=None, requests=None, concurrency=None, max_tokens=None, prompts=None,
          json=False, compare=None, parallel=None, accept_new_host_keys=False, repeat=None,
          seed=None, temperature=None, random_input_len=None, ignore_eos=False):
    # Numbers default to None (not 32/4/128) so Invoke passes them as text and a bad value
    # such as `--requests abc` becomes a one-line error with exit 2, not a traceback.
    return _boundary(c, "bench", locals())


@command(member="only this member (its target.name; default: every member)",
         json="print one JSON object per host on stdout (human text goes to stderr)")
def sleep(c, profile=None, member=None, json=False, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "sleep", locals())


@command(member="only this member (its target.name; default: every member)",
         json="print one JSON object per host on stdout (human text goes to stderr)")
def wake(c, profile=None, member=None, json=False, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "wake", locals())


@command(out="write it to this file, replaced in one rename (default: stdout)")
def targets(c, profile=None, out=None, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "targets", locals())


@command(**{
    "verify": "re-hash every file on the hosts (default: trust a file verified before whose "
              "size and mtime did not change) and fetch again what is wrong",
    "json": "print one JSON object per host on stdout (human text goes to stderr)",
})
def pull(c, profile=None, verify=False, json=False, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "pull", locals())


@command(iterable=("vary",), **{
    "vary": "KEY=V1,V2,...: a dotted key into the profile and its values; repeat the flag "
            "for more keys (the variants are the product), e.g. "
            "server.args.speculative-config.num_speculative_tokens=1,2,4",
    "profiles": "comma-separated profiles, each one more variant (deployed as this deployment)",
    "baseline": "one more variant: the profile with no speculative config",
    "concurrency": "comma-separated concurrencies to measure each variant at",
    "requests": "measured requests per bench run, after one warm-up request",
    "input-len": "lengthen each shipped prompt to about N words (default: as shipped)",
    "max-tokens": "max_tokens per request",
    "repeat": "bench runs per variant and concurrency; their spread decides ties",
    "seed": "the order of the shipped prompts; the same for every variant",
    "objective": "tokens_per_s@C (most output tokens/s at concurrency C; default: the "
                 "largest C) or ttft_p90@C (lowest TTFT p90)",
    "keep": "previous (default): put back what ran before; winner: leave the winner running",
    "out": "directory for results.jsonl, report.html and <stem>.tuned.toml "
           "(default ~/.local/state/llmfab/tune/<name>-<UTC stamp>/, under $XDG_STATE_HOME if set)",
    "resume": "continue the sweep in this directory: measure only what it lacks",
    "json": "print the result records and the decision as JSON Lines on stdout",
    "slo": "latency bounds in ms, e.g. ttft_p90<=800,tpot_p50<=40 (keys ttft_pXX, tpot_pXX, "
           "itl_pXX, e2e_pXX): each variant's capacity is the largest load meeting all of them, "
           "and the winner serves the most output tok/s there (goodput)",
    "load": "with --slo: what the search raises, concurrency (default) or rate (requests/s, "
            "Poisson arrivals)",
    "max-load": "with --slo: the largest load tried",
    "slots": "auto or N: measure N variants at once on each host, each on its own GPUs and "
             "port (auto: as many as the host's GPUs hold; default 1)",
})
def tune(c, profile=None, vary=None, profiles=None, baseline=False, concurrency=None,
         requests=None, input_len=None, max_tokens=None, repeat=None, seed=None,
         objective=None, keep=None, out=None, resume=None, json=False, slo=None, load=None,
         max_load=None, slots=None, parallel=None, accept_new_host_keys=False):
    return _boundary(c, "tune", locals())
