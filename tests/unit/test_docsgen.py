"""docs/reference/ is generated from the code and kept current; the README stays a front door."""
import re
from pathlib import Path

import pytest

from tasks import docsgen, ns
from tasks.failures.rules import RULES as FAILURE_RULES
from tasks.doctor.host.spec_rules import LOG_RULES, RULES as DOCTOR_RULES
from tasks.profile import load_profile, tomllib
from tasks.profile.readers import Checker
from tasks.profile.keys import TABLES, Key

ROOT = Path(__file__).resolve().parents[2]


def test_every_reference_page_is_current():
    assert docsgen.stale() == [], "docs/reference/ is stale: run `python3 -m tasks.docsgen`"


def test_check_mode_names_a_stale_page_and_write_fixes_it(tmp_path):
    assert docsgen.stale(tmp_path) == list(docsgen.PAGES)
    docsgen.write(tmp_path)
    assert docsgen.stale(tmp_path) == []
    (tmp_path / "cli.md").write_text("old\n")
    assert docsgen.stale(tmp_path) == ["cli.md"]


def _tables_the_loader_checks(monkeypatch, paths):
    """Every `known` keys argument the loader hands Checker.table while loading `paths`."""
    seen = []
    real = Checker.table

    def spy(self, value, path, known):
        seen.append((path, known))
        return real(self, value, path, known)
    monkeypatch.setattr(Checker, "table", spy)
    for p in paths:
        load_profile(p, environ={"HF_TOKEN": "x", "VLLM_API_KEY": "x"})
    return seen


def test_every_key_the_loader_accepts_is_documented(monkeypatch):
    # Whoever adds a table or a key declares it with keys.table(...): a Key with its type,
    # default and meaning. A plain tuple of names here means an undocumented key.
    profiles = sorted((ROOT / "configs").glob("*.toml"))
    seen = _tables_the_loader_checks(monkeypatch, profiles)
    assert {p[0] if p else "" for p, _ in seen} >= {"", "target", "server"}
    for path, known in seen:
        if path[:2] == ("server", "env"):
            continue  # a secret's own { from_env = "NAME" }
        assert any(known is t for t in TABLES.values()), f"[{'.'.join(map(str, path))}]: keys " \
            "without a description; declare them with tasks.profile.keys.table(...)"
        assert all(isinstance(k, Key) and k.type and k.default and k.meaning for k in known.values())


def test_every_table_of_the_top_level_has_its_keys_documented():
    # A new [table] is a top-level Key of type "table" and a keys.table(name, ...) of its own
    # (the free-form [server.args] and [server.env] are described in [server]).
    tables = [k.name for k in TABLES[""].values() if k.type == "table"]
    assert tables and all(name in TABLES for name in tables), (tables, list(TABLES))
    assert set(TABLES) - {""} <= set(tables), "a key table that no top-level key names"


def _loaded_value(profile, table, key):
    if table == "":
        return None
    return getattr(getattr(profile, table), key)


def test_documented_defaults_are_what_the_loader_gives(tmp_path):
    path = tmp_path / "minimal.toml"
    path.write_text('[server]\nengine = "command"\ncommand = ["srv"]\n'
                    '[cluster]\nworkers = ["w1"]\n[supervise]\n[check]\n')
    profile = load_profile(path, environ={})
    # [container] exists only with a container runtime: its defaults from a profile that has one
    boxed = tmp_path / "container.toml"
    boxed.write_text('[server]\nengine = "command"\ncommand = ["srv"]\nruntime = "podman"\n'
                     '[container]\nimage = "x"\n')
    in_container = load_profile(boxed, environ={})
    checked = 0
    for table, keys in TABLES.items():
        if table == "":
            continue
        for key in keys.values():
            try:
                want = tomllib.loads(f"x = {key.default}")["x"]
            except tomllib.TOMLDecodeError:
                continue  # a default in words
            got = _loaded_value(in_container if table == "container" else profile, table, key.name)
            if isinstance(got, tuple):
                got = list(got)
            if isinstance(want, dict):
                want = []  # args and env: an empty table loads as no pairs
            assert got == want, f"[{table}] {key.name}: documented default {key.default}, loaded {got!r}"
            checked += 1
    assert checked >= 20


def test_profile_page_lists_every_key_of_every_table():
    text = docsgen.profile_page()
    for table, keys in TABLES.items():
        if table:
            assert f"## [{table}]" in text
        for key in keys:
            assert f"| `{key}` |" in text


def test_cli_page_lists_every_task_flag_and_exit_code():
    text = docsgen.cli_page()
    for name in ns.task_names:
        assert f"## `fab {name}`" in text
        for arg in docsgen.arguments(ns[name]):
            assert f"--{max(arg.names, key=len)}" in text and arg.help in text
    assert docsgen.cli_page() == text  # rendering leaves the tasks' help in place
    for code in (0, 1, 2, 3, 130):
        assert f"| `{code}` |" in text


def test_rule_pages_hold_every_rule_with_its_source():
    doctor = docsgen.doctor_page()
    for rule in DOCTOR_RULES + LOG_RULES:
        assert f"`{rule.id}`" in doctor and rule.source.split(";")[0] in doctor
    assert "{" not in doctor  # placeholders render as <name>
    failures = docsgen.failure_page()
    rows = [line for line in failures.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [r.id for r in FAILURE_RULES]
    for rule, row in zip(FAILURE_RULES, rows):
        assert all(p.source.split(" ")[0] in row for p in rule.patterns)


def test_every_client_and_host_module_says_what_it_holds():
    # The architecture page is their docstrings' first paragraphs: a module without one
    # would be a blank row.
    missing = [path for path, text in docsgen.modules("tasks")
               if not text and not path.endswith("__init__.py")]
    assert missing == []
    page = docsgen.architecture_page()
    assert all(f"`{path}`" in page for path, text in docsgen.modules("tasks") if text)


README_LIMIT = 15 * 1024
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _markdown_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def test_the_readme_is_a_front_door_at_most_15_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/"


SETUP_COMMANDS = [
    "python3 -m venv --upgrade-deps .venv && .venv/bin/pip install -q -e . && . .venv/bin/activate "
    "&& fab deploy && fab status && fab bench && fab stop",
    "bash .ci/run",
]


def test_the_readme_sets_up_with_exactly_the_two_commands():
    # The demo on this machine, then the tests: on a stock Debian/Ubuntu Python in a virtualenv.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = [line[4:] for line in setup.splitlines() if line.startswith("    ")]
    assert commands == SETUP_COMMANDS


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_local_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (page.parent / path).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


CHANGELOG_LIMIT = 8 * 1024
# Keep a Changelog (keepachangelog.com 1.1.0): "## [Unreleased]", then released versions newest
# first as "## [X.Y.Z] - YYYY-MM-DD", each with "### <type>" sections of "- " entries.
CHANGE_TYPES = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
VERSION_HEADING = re.compile(r"## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")
ENTRY_LIMIT = 320  # characters of one entry: a line or two, not a story


def _changelog():
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_changelog_is_at_most_8_kb():
    size = len((ROOT / "CHANGELOG.md").read_bytes())
    assert size <= CHANGELOG_LIMIT, (
        f"CHANGELOG.md is {size} bytes (limit {CHANGELOG_LIMIT}): shorten entries to one line")


def _changelog_sections(text):
    """[(heading, [(type, [entry, ...]), ...]), ...] for each "## " section of the changelog."""
    sections = []
    for block in text.split("\n## ")[1:]:
        heading, _, body = block.partition("\n")
        types = []
        for part in body.split("\n### ")[1:]:
            kind, _, entries = part.partition("\n")
            items = [e.strip() for e in re.split(r"^- ", entries, flags=re.M)[1:]]
            stray = re.split(r"^- ", entries, flags=re.M)[0].strip()
            assert not stray, f"CHANGELOG.md: text outside an entry under {heading} / {kind}"
            types.append((kind.strip(), items))
        assert not body.split("\n### ")[0].strip(), f"CHANGELOG.md: {heading} has text before its first ###"
        sections.append(("## " + heading.strip(), types))
    return sections


def test_the_changelog_has_the_keep_a_changelog_shape():
    sections = _changelog_sections(_changelog())
    assert sections[0][0] == "## [Unreleased]", "CHANGELOG.md must start with ## [Unreleased]"
    released = []
    for heading, types in sections[1:]:
        match = VERSION_HEADING.match(heading)
        assert match, f"CHANGELOG.md: {heading!r} is not '## [X.Y.Z] - YYYY-MM-DD'"
        released.append((tuple(int(n) for n in match.groups()[:3]), match.group(4)))
        assert types, f"CHANGELOG.md: {heading} has no entries"
    assert released == sorted(released, reverse=True), "CHANGELOG.md: versions must be newest first"
    for heading, types in sections:
        for kind, entries in types:
            assert kind in CHANGE_TYPES, f"CHANGELOG.md: '### {kind}' under {heading}: use one of {CHANGE_TYPES}"
            assert entries or heading == "## [Unreleased]", f"CHANGELOG.md: {heading} / {kind} is empty"
            for entry in entries:
                assert len(" ".join(entry.split())) <= ENTRY_LIMIT, (
                    f"CHANGELOG.md: an entry under {heading} / {kind} is over {ENTRY_LIMIT} "
                    f"characters: {entry[:60]}...")
        kinds = [kind for kind, _ in types]
        assert len(kinds) == len(set(kinds)), f"CHANGELOG.md: {heading} repeats a ### heading"


def test_the_newest_release_is_the_package_version():
    newest = VERSION_HEADING.match(_changelog_sections(_changelog())[1][0])
    version = re.search(r"^version = (\S+)$", (ROOT / "setup.cfg").read_text(), re.M).group(1)
    assert version == ".".join(newest.groups()[:3]), (
        f"setup.cfg's version {version} is not CHANGELOG.md's newest release")


# Sentences that were false for a user: files only the authors had, modules renamed away,
# notes about the authors' branches. The project stands alone: it cites its own docs or the
# engine's source instead.
STALE_WORDS = ("DESIGN.md", "DOMAIN.md", "agentpayload", "not on main yet", "the coordinator fills")


def test_no_file_cites_what_users_do_not_have():
    tracked = [ROOT / "README.md"] + [p for d in ("tasks", "docs", "tests", "configs", "benchmarks")
                                      for p in (ROOT / d).rglob("*")
                                      if p.is_file() and p.suffix in (".py", ".md", ".toml", ".txt")]
    this = Path(__file__).resolve()
    found = [f"{p.relative_to(ROOT)}: {w}" for p in tracked if p.resolve() != this
             for w in STALE_WORDS if w in p.read_text(encoding="utf-8", errors="replace")]
    assert found == []
