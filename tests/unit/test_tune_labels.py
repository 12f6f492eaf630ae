"""The verdict and note cells of `fab tune`'s table say what was measured: `few drafts` only
when the doctor saw too few drafts to judge, `not judged` when it judges none for the engine
(the demo, a `command` server, after hundreds of drafts), and a baseline that drafted anyway
says it still speculates."""
from types import SimpleNamespace

from tasks.tune import results


def rec(name, spec, settings=None):
    return {"variant": name, "settings": settings or {}, "concurrency": 1, "status": "measured",
            "host": "local", "output_tokens_per_s": 100.0, "ttft_ms": {"p90": 20.0}, "errors": 0,
            "spec": spec}


def cells(records):
    variants = [SimpleNamespace(name=r["variant"]) for r in records]
    headers, rows = results.table(records, variants, [1], ("tokens_per_s", 1), {})
    at = headers.index("verdict")
    return {row[0]: (row[at], row[at + 2]) for row in rows}


def test_each_verdict_cell_says_what_the_doctor_did():
    spec = {"acceptance_rate": 0.62, "mean_acceptance_length": 3.48, "per_position": [1.0]}
    got = cells([
        rec("command", dict(spec)),                                   # no verdict for this engine
        rec("few", dict(spec, verdict=None)),                         # judged: too few drafts
        rec("judged", dict(spec, verdict="healthy")),
        rec("baseline", dict(spec), {"speculative": None}),           # drafted with no flag
        rec("plain", None, {"speculative": None}),
    ])
    assert got["command"] == ("not judged", "")
    assert got["few"] == ("few drafts", "")
    assert got["judged"] == ("healthy", "")
    assert got["baseline"] == ("not judged", "still speculates: the server drafts with no speculative flag")
    assert got["plain"] == ("no spec", "")
