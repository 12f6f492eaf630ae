"""Fabric executor that hands `-H` hosts to llmfab's own fan-out instead of looping.

Fabric's executor calls a task once per `-H` host, one after the other, with a
Connection. llmfab tasks need every host at once (bounded parallelism, one summary
table, the worst exit code), so this executor calls each task once with a plain
Context and leaves the host list in the config (`llmfab_hosts`). `fab` selects it
through the project's `fabric.json` (`tasks.executor_class`), `llmfab` directly
(tasks/program.py).
"""
from fabric.executor import Executor
from invoke.executor import Executor as InvokeExecutor

from ..interrupts import INTERRUPTED_EARLY, task_begins


class FanoutExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):
        host_str = self.core[0].args.hosts.value if apply_hosts else None
        hosts = [h.strip() for h in host_str.split(",") if h.strip()] if host_str else []
        self.config["llmfab_hosts"] = hosts
        return InvokeExecutor.expand_calls(self, calls)


def exit_2_on_bad_arguments(program=None, *, binary="fab"):
    """Make the program exit 2 (bad input) on unknown flags and bad flag values, as docs/reference/cli.md says,
    130 on a Ctrl-C before a task's body, and show each flag's value type in `--help TASK`.

    Invoke turns a ParseError into exit 1 and lets a failed int() cast escape as a
    traceback. Task arguments are parsed after the fabfile is imported, so wrapping
    the running program's `parse_tasks` here is early enough. Without `program`, only
    the `fab` program of Fabric is touched (importing this package elsewhere changes
    nothing); `llmfab` (tasks/program.py) passes its own, with its name for the hint.
    """
    import sys

    if program is None:
        program = getattr(sys.modules.get("fabric.main"), "program", None)
    if program is None or getattr(program, "_llmfab_wrapped", False):
        return
    from invoke.exceptions import Exit, ParseError

    original = program.parse_tasks

    def parse_tasks():
        try:
            return original()
        except (ParseError, ValueError) as e:
            raise Exit(f"error: {e} (see `{binary} --help TASK`)", code=2) from None
        except KeyboardInterrupt:
            raise Exit(INTERRUPTED_EARLY, code=130) from None

    execute = program.execute

    def execute_130():
        # Invoke turns a KeyboardInterrupt into exit 1; a task's own Ctrl-C is 130 (tasks/cli.py
        # _boundary, tasks/interrupts.py), and so is one between parsing and the task body.
        task_begins()
        try:
            return execute()
        except KeyboardInterrupt:
            raise Exit(INTERRUPTED_EARLY, code=130) from None

    def make_parser():
        # the task contexts whose help shows each flag's value and default (tasks/cli.py _TaskHelp)
        from invoke.parser import Parser
        from ..cli import task_contexts
        return Parser(initial=program.initial_context,
                      contexts=task_contexts(program.collection, program.config.tasks.ignore_unknown_help))

    program._make_parser = make_parser
    program.parse_tasks = parse_tasks
    program.execute = execute_130
    program._llmfab_wrapped = True

