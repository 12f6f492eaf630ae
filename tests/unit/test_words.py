"""Human text says things in words: no "process(es)", no Python `None` in a report, no
"none yet" for a verdict that only waits for drafts (issue: Python internals in human text)."""
from pathlib import Path

from tasks.output import processes
from tasks.tune.htmlreport import setting_text

TASKS = Path(__file__).resolve().parents[2] / "tasks"


def test_counts_of_processes_are_words():
    assert (processes(0), processes(1), processes(4)) == ("0 processes", "1 process", "4 processes")
    offenders = [str(p) for p in TASKS.rglob("*.py") if "(es)" in p.read_text()]
    assert not offenders, offenders


def test_the_baselines_setting_reads_as_no_speculation_not_none():
    assert setting_text("speculative", None) == "no speculative decoding (every speculative flag removed)"
    assert setting_text("server.args.x", None) == "server.args.x removed"
    assert setting_text("server.args.speculative-config.num_speculative_tokens", 4) == \
        "server.args.speculative-config.num_speculative_tokens = 4"


def test_a_variant_without_enough_drafts_says_so_in_the_table():
    from tasks.tune import results
    src = Path(results.__file__).read_text()
    assert '"none yet"' not in src and '"few drafts"' in src
