"""benchmarks/: the harness's pure helpers, and every benchmark the docs cite is there and answers
--help (the benchmarks themselves are not tests: `python benchmarks/run.py NAME`, as root)."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def _load(name):
    """A benchmarks/ module by its path (benchmarks/ stays off sys.path: its agentstart.py would
    shadow tests/agentstart.py)."""
    spec = importlib.util.spec_from_file_location("benchmarks_" + name, BENCH / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load("harness")
count_sshd, fmt_spread, md_table, ratio = harness.count_sshd, harness.fmt_spread, harness.md_table, harness.ratio

# Lines as the lab's sshd (OpenSSH 9.2, LogLevel VERBOSE, `sshd -D -e`) writes them.
LOG = """\
Connection from 10.213.4.1 port 44680 on 10.213.4.11 port 22 rdomain ""
Accepted key ED25519 SHA256:hDue found at /var/tmp/llmfab-lab-4/client_ed25519.pub:1
Postponed publickey for root from 10.213.4.1 port 44680 ssh2 [preauth]
Accepted key ED25519 SHA256:hDue found at /var/tmp/llmfab-lab-4/client_ed25519.pub:1
Accepted publickey for root from 10.213.4.1 port 44680 ssh2: ED25519 SHA256:hDue
Starting session: command for root from 10.213.4.1 port 44680 id 0
Starting session: subsystem 'sftp' for root from 10.213.4.1 port 44680 id 1
Close session: user root from 10.213.4.1 port 44680 id 1
Read error from remote host 10.213.4.1 port 44680: Connection reset by peer
Connection from 10.213.4.1 port 50072 on 10.213.4.11 port 22 rdomain ""
Accepted publickey for root from 10.213.4.1 port 50072 ssh2: ED25519 SHA256:hDue
Starting session: shell on pts/0 for root from 10.213.4.1 port 50072 id 0
Starting session: command for root from 10.213.4.1 port 50072 id 1
Received disconnect from 10.213.4.1 port 50072:11: disconnected by user
"""


def test_count_sshd_counts_connections_and_every_kind_of_remote_command():
    assert count_sshd(LOG) == {"connections": 2, "exec": 2, "subsystem": 1, "shell": 1, "commands": 4}


def test_count_sshd_ignores_preauth_and_key_lines_and_empty_text():
    assert count_sshd("Accepted key ED25519 SHA256:x found at f:1\nPostponed publickey for root\n") == \
        {"connections": 0, "exec": 0, "subsystem": 0, "shell": 0, "commands": 0}
    assert count_sshd("")["commands"] == 0


def test_formatting_helpers():
    assert fmt_spread([0.3, 0.1, 0.2]) == "0.20 (0.10-0.30)" and fmt_spread([]) == "n/a"
    assert ratio(3.0, 2.0) == "1.50x" and ratio(None, 2.0) == "n/a" and ratio(1.0, 0) == "n/a"
    assert md_table(["a", "b"], [[1, "x|y"]]) == "| a | b |\n| --- | --- |\n| 1 | x\\|y |"


def test_spread_is_the_median_of_repeats_and_side_by_side_rotates_and_pairs_by_repetition():
    from tasks.measure.repeats import median
    assert harness.spread([0.4, None, 0.1, 0.2]) == (median([0.4, 0.1, 0.2], 6), 0.1, 0.4)
    assert harness.spread([None]) is None
    order, walls = [], iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def one(key, tool):
        order.append(tool)
        if (key, tool) == (1, "b") and len(order) == 5:
            raise RuntimeError("down")
        return {"wall": next(walls)}
    res, failed = harness.side_by_side([(1, ["a", "b"])], 2, one, errors=(RuntimeError,), log=lambda _: None)
    assert order == ["b", "a", "a", "b", "b", "a"]  # warm-up, rep 0, rep 1: the order rotates
    assert [r["rep"] for r in res[(1, "a")]] == [0, 1] and [r["rep"] for r in res[(1, "b")]] == [0]
    assert failed == {(1, "b"): ["down"]}
    assert harness.paired_ratios(res, (1, "a"), (1, "b")) == [3.0 / 4.0]  # rep 1 has no b


# `python benchmarks/run.py NAME`, and any file under benchmarks/, as the docs write them
CITED_RUN = re.compile(r"benchmarks/run\.py +([a-z][a-z0-9-]*)")
CITED_FILE = re.compile(r"(?<![\w/])benchmarks/[A-Za-z0-9_./-]+\.(?:py|sh|json|png|md)")


def _docs():
    return [p for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))] + sorted(BENCH.glob("*.md"))]


def test_every_benchmark_the_docs_cite_exists_and_every_one_answers_help():
    cited_files, cited_names = set(), set()
    for doc in _docs():
        text = doc.read_text(encoding="utf-8")
        cited_files |= {(doc.name, m) for m in CITED_FILE.findall(text)}
        cited_names |= {(doc.name, m) for m in CITED_RUN.findall(text)}
    assert any(name == "RESULTS.md" for name, _ in cited_names)
    assert [(d, f) for d, f in sorted(cited_files) if not (REPO / f).is_file()] == []
    # One interpreter runs every NAME --help through the real entry point (fast: nothing starts).
    probe = ("import json, sys\nsys.argv[0] = 'run.py'\nsys.path.insert(0, %r)\nimport run\nout = {}\n"
             "for name in run.BENCHMARKS:\n"
             "    try:\n        run.main([name, '--help'])\n        out[name] = 'returned'\n"
             "    except SystemExit as e:\n        out[name] = e.code\n"
             "print(json.dumps(out))\n") % str(BENCH)
    r = subprocess.run([sys.executable, "-c", probe], cwd=str(REPO), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    codes = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(d, n) for d, n in sorted(cited_names) if n not in codes] == []
    assert codes == {name: 0 for name in codes} and len(codes) >= 8
    assert all("usage: run.py %s " % name in r.stdout for name in codes)
