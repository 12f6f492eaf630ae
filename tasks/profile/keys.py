"""The documented keys of each profile table: name, type, default and meaning, in one record.

Each table's keys are declared once, beside the code that reads them (tasks/profile/schema.py,
checktable.py), as `table("target", Key(...), ...)`; the checker refuses any other key, and
docs/reference/profile.md is generated from the same records (tasks/docsgen.py), as pyinfra
generates its connector pages from the description and default beside each connector key.

`default` is written as TOML (`5`, `"/health"`, `[]`) when it is a plain value; a test loads a
minimal profile and checks each such default against what the loader really gives. A default
that depends on something else is said in words; "required" marks a key that must be set.
"""
from typing import Dict, NamedTuple

# table name ("" for the top level) -> {key name: Key}, in the order the tables were declared
TABLES: Dict[str, dict] = {}


class Key(NamedTuple):
    name: str
    type: str       # in TOML's words: "string", "integer >= 2", "array of strings", "table"
    default: str    # TOML text of the default, or words when it depends on something else
    meaning: str    # what it does, in a sentence or two


def table(name, *keys):
    """Register the keys of the table `name`; returns {key name: Key} for `Checker.table`."""
    known = {k.name: k for k in keys}
    if len(known) != len(keys):
        raise ValueError(f"[{name}]: a key is declared twice")
    TABLES[name] = known
    return known
