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

from ..interrupts import early_words, exit_status, task_begins


class FanoutExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):
        host_str = self.core[0].args.hosts.value if apply_hosts else None
        hosts = [h.strip() for h in host_str.split(",") if h.strip()] if host_str else []
        if host_str is not None and not hosts:  # `-H "$HOSTS"` with HOSTS unset: never the profile's
            from invoke.exceptions import Exit
            raise Exit("error: -H/--hosts was given an empty value; name the host(s), or leave "
                       "the flag out for the profile's target.hosts (nothing was done)", code=2)
        self.config["llmfab_hosts"] = hosts
        return InvokeExecutor.expand_calls(self, calls)


def exit_2_on_bad_arguments(program=None, *, binary="fab", collection=None):
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

    def refuse_core_letter(collection):
        said = core_letter_after_task(collection, program.initial_context,
                                      getattr(program, "argv", None) or sys.argv, binary)
        if said:
            from ..output import terminal_lines
            raise Exit(terminal_lines(f"error: {said}"), code=2)

    if collection is not None and getattr(program, "argv", None):
        # `fab`: its core options (-l ABC included) were parsed and it is importing fabfile.py,
        # whose collection is `collection`; it would act on them next
        refuse_core_letter(collection)
    parse_collection = program.parse_collection

    def parse_collection_first():
        # `llmfab`: the collection is bundled; the core options act in parse_collection
        refuse_core_letter(program.namespace or collection)
        return parse_collection()
    if getattr(program, "namespace", None) is not None:
        program.parse_collection = parse_collection_first

    def parse_tasks():
        try:
            return original()
        except ParseError as e:
            from ..output import terminal_lines  # a flag's value is shown, never its raw bytes
            raise Exit(terminal_lines(f"error: {parse_error_words(e, program, binary)} "
                                      f"(see `{binary} --help TASK`)"), code=2) from None
        except ValueError as e:
            from ..output import terminal_lines
            raise Exit(terminal_lines(f"error: {e} (see `{binary} --help TASK`)"), code=2) from None
        except KeyboardInterrupt:
            raise Exit(early_words(), code=exit_status()) from None

    execute = program.execute

    def execute_130():
        # Invoke turns a KeyboardInterrupt into exit 1; a task's own Ctrl-C is 130 (tasks/cli.py
        # _boundary, tasks/interrupts.py), and so is one between parsing and the task body.
        task_begins()
        try:
            return execute()
        except KeyboardInterrupt:
            raise Exit(early_words(), code=exit_status()) from None

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


def core_letter_after_task(collection, initial_context, argv, binary="fab"):
    """The words for a one-letter flag written after a task's name that the task does not
    take but the program's core options do (`fab tail-log -l 5`: tail-log's flags are long
    since its -l could only be Fabric's --list, which would take `5` as a collection), or
    None. Fabric parses its core options from the whole command line first, so without this
    the task would never see it and Fabric would answer something unrelated."""
    import re
    try:
        tasks = collection.task_names
        core = set(initial_context.flags) | set(getattr(initial_context.flags, "aliases", {}))
    except Exception:  # noqa: BLE001 - only a better message is lost
        return None
    names = {n: primary for primary, aliases in tasks.items() for n in [primary, *aliases]}
    task = None
    for tok in list(argv)[1:]:
        if tok == "--":
            return None
        if task is None:
            task = names.get(tok)
            continue
        if tok in names:
            task = names[tok]
            continue
        m = re.fullmatch(r"-([A-Za-z])", tok.split("=", 1)[0])
        if not m or tok.split("=", 1)[0] not in core:
            continue
        flag = tok.split("=", 1)[0]
        was = _auto_short_flags(collection[task])  # what Invoke once gave its flags
        if flag not in was:
            continue
        return (f"{task} has no flag {flag} any more: {binary} reads it as its own option even "
                f"after the task; write {was[flag]} (see `{binary} --help {task}`)")
    return None


def _auto_short_flags(task):
    """{"-l": "--lines"}: the one-letter flags Invoke gave this task's flags by itself (first
    free letter of each name, in signature order) before llmfab kept short flags to
    tasks/cli.py SHORT_FLAGS, less those it still has."""
    import copy
    from invoke import Task
    now = {"-" + n: a for a in task.get_arguments() for n in a.names if len(n) == 1}
    old = copy.copy(task)
    old.auto_shortflags = True
    out = {}
    for a in Task.get_arguments(old):
        for n in a.names:
            if len(n) == 1 and "-" + n not in now:
                out["-" + n] = "--" + a.name.replace("_", "-")
    return out


def parse_error_words(e, program, binary="fab"):
    """Invoke's parse errors in words: the flag as the user typed it, never `<Argument: ...>`,
    and a task's flag given before any task name said to be one."""
    import re
    text = str(e)
    m = re.match(r"Flag <Argument: ([\w-]+)", text)
    if m:
        name = m.group(1).replace("_", "-")
        return "%s needs a value" % ("-" + name if len(name) == 1 else "--" + name)
    m = re.match(r"No idea what '(.*)' is!$", text)
    if not m:
        return text
    token, task = m.group(1), getattr(getattr(e, "context", None), "name", None)
    if not token.startswith("-"):
        return "no task %r; `%s --list` lists them" % (token, binary)
    if task:
        return "%s has no flag %s" % (task, token)
    try:
        tasks = sorted(c.name for c in program.collection.to_contexts() if token in c.flags)
    except Exception:  # noqa: BLE001 - only a better hint is lost
        tasks = []
    if tasks:
        import sys
        named = [a for a in (getattr(program, "argv", None) or sys.argv) if a in tasks]
        return ("%s is a flag of the task, not of %s: write it after the task name (%s %s %s ...)"
                % (token, binary, binary, (named or tasks)[0], token))
    return "unknown flag %s" % token
