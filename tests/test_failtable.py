"""The README's failure-rule table is generated from tasks/failrules/ and kept current."""
from tasks import failtable
from tasks.failrules import RULES


def test_readme_table_is_current():
    text = failtable.README.read_text()
    assert failtable.replace_section(text, failtable.render()) == text, \
        "README.md's failure-rule table is stale: run `python3 -m tasks.failtable`"


def test_table_has_one_row_per_rule_with_its_sources():
    rows = [l for l in failtable.render().splitlines() if l.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [r.id for r in RULES]
    for rule, row in zip(RULES, rows):
        assert all(p.source.split(" ")[0] in row for p in rule.patterns)


def test_check_mode_reports_a_stale_table(tmp_path, monkeypatch):
    stale = tmp_path / "README.md"
    stale.write_text(f"intro\n{failtable.BEGIN}\n| old |\n{failtable.END}\nrest\n")
    monkeypatch.setattr(failtable, "README", stale)
    assert failtable.main(["--check"]) == 1
    assert failtable.main([]) == 0 and failtable.main(["--check"]) == 0
    assert stale.read_text().startswith("intro\n") and stale.read_text().endswith("\nrest\n")
