"""The README's doctor section is generated from the rule table: stale means this fails."""
from pathlib import Path

from tasks import rulesdoc
from tasks.hostside.specrules import LOG_RULES, RULES

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_rule_table_is_current():
    got = rulesdoc.section(README.read_text())
    assert got is not None, "README.md lost its doctor-rules markers"
    assert got == rulesdoc.render(), "README.md's rule table is stale: run `python3 -m tasks.rulesdoc`"


def test_every_rule_and_its_source_is_in_the_table():
    text = rulesdoc.render()
    for rule in RULES + LOG_RULES:
        assert f"`{rule.id}`" in text and rule.source.split(";")[0] in text
    assert "{" not in text  # placeholders render as <name>
