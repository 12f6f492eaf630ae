"""Which module of this package serves which agent op: found by reading the sources.

Every module here may declare `OPS = {"name": function, ...}` (a dict literal with
string keys). Nobody keeps a list of modules or ops: `scan()` reads each `*.py` of
the package with `ast` (nothing is imported, so the order of modules never matters)
and refuses an op name declared twice, naming both files -- a module added by
another change can never silently shadow an existing op.

The client runs `scan()` when it builds the agent's payload and ships the result as
the generated module `_opindex` (INDEX_MODULE), so the agent on the host imports a
module only when a request for one of its ops arrives and never parses anything.
In-tree (tests that run the agent on in-memory streams) the agent scans itself.
Standard library only; Python >= 3.9.
"""
import os

INDEX_MODULE = "_opindex"


class OpIndexError(Exception):
    """The package's op declarations are ambiguous or unreadable (a programming error)."""


def _ops_lines(source):
    """Where each line that starts with `OPS =` or `OPS:` begins (str.find: a regex over
    every line of ~30 modules cost the client ~2 ms per task)."""
    at = 0 if source.startswith("OPS") else _next_ops(source, 0)
    while at >= 0:
        if source[at + 3:at + 40].lstrip(" \t")[:1] in (":", "="):
            yield at
        at = _next_ops(source, at)


def _next_ops(source, at):
    i = source.find("\nOPS", at)
    return -1 if i < 0 else i + 1


def _statements(source):
    """(line number, parsed statement or None) of each top-level statement that assigns OPS.
    Only those lines are parsed: the client scans the package on every task, and parsing
    all ~100 KB of it would cost tens of ms of CPU each time."""
    for start in _ops_lines(source):
        lineno = source.count("\n", 0, start) + 1
        lines = source[start:].splitlines(keepends=True)
        guess = _closing_line(lines)  # usually right at once: one parse, not one a line
        node = _parse("".join(lines[:guess])) if guess is not None else None
        if node is None:
            for last in range(1, len(lines) + 1):  # the shortest run of lines that parses
                node = _parse("".join(lines[:last]))
                if node is not None:
                    break
        yield lineno, node


def _closing_line(lines):
    """How many of `lines` it takes for the brackets opened in the first to close again,
    counting brackets only (a bracket inside a string can fool it: the caller checks the
    guess by parsing it)."""
    depth = 0
    for i in range(len(lines)):
        for ch in lines[i]:
            if ch in "{[(":
                depth += 1
            elif ch in "}])":
                depth -= 1
        if depth <= 0:
            return i + 1
    return None


def _parse(text):
    """The first statement of `text`, or None when it does not parse."""
    import ast
    try:
        return ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return None


def declared_ops(source, filename="<source>"):
    """The op names a module's source declares in its top-level `OPS = {...}` (in order)."""
    import ast  # here: the agent imports this module only in-tree, never on a host
    names = []
    for lineno, node in _statements(source):
        value = getattr(node, "value", None)
        if not isinstance(value, ast.Dict):
            raise OpIndexError("%s:%d: OPS must be a dict literal (the agent finds ops by reading "
                               "the source)" % (filename, lineno))
        for key in value.keys:
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise OpIndexError("%s:%d: every OPS key must be a string literal"
                                   % (filename, lineno))
            names.append(key.value)
    return names


def module_names(directory):
    """The package's module names (every `*.py` but the generated index), sorted."""
    return sorted(n[:-3] for n in os.listdir(directory)
                  if n.endswith(".py") and n[:-3] != INDEX_MODULE)


def scan(directory, sources=None):
    """{op: module} for the package in `directory` (or `sources`: {module: text}).

    Raises OpIndexError when two modules (or one module twice) declare the same op.
    """
    if sources is None:
        sources = {}
        for name in module_names(directory):
            with open(os.path.join(directory, name + ".py"), encoding="utf-8") as f:
                sources[name] = f.read()
    index = {}
    for name in sorted(sources):
        for op in declared_ops(sources[name], "%s.py" % name):
            if op in index:
                raise OpIndexError("agent op %r is declared twice: in %s.py and in %s.py; "
                                   "op names must be unique across tasks/hostside"
                                   % (op, index[op], name))
            index[op] = name
    return index


def render(index):
    """The generated `_opindex` module's source for an index."""
    lines = ['"""Generated by tasks/hostside/registry.py when the payload is built: op -> module."""',
             "INDEX = {"]
    lines += ["    %r: %r," % (op, index[op]) for op in sorted(index)]
    return "\n".join(lines + ["}", ""])
