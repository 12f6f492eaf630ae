"""Unit tests of benchmarks/measure.py (the helpers of benchmarks/run.py; the benchmark
itself is a script, not a test: `python benchmarks/run.py`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from measure import count_sshd, fmt_spread, md_table, ratio  # noqa: E402

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
