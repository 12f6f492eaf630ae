"""`fab pull` never silently differs from its source, and two pulls at once never break each
other (issue 38), on 2 real lab hosts with real files:

- two pulls at once: another profile's pull (even a no-op) beside a running one leaves the
  running pull's key and files alone; a second pull of the same directory is refused, naming
  the running one;
- a `local:` source's own manifest.json, dot-directories, links inside it are copied; a link
  out of it, a dangling link and a FIFO are refused naming them (no hang);
- a drafter nested in the model directory is one plan: no WARN about its files, never removed;
- a source file changed with its mtime kept fails once, in words, and `--verify` re-hashes it;
- 2,000 small files go in batches (one receiver per batch), not one SSH exec each;
- `check` says a half-pulled model directory is incomplete; the space error names the margin.
"""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from genmodel import make_model
from helpers import Background, fab, flat, write_profile
from hostlab import HostLab, wait_for

HOSTS = ["h1", "h2"]


@pytest.fixture(scope="module")
def lab():
    from conftest import require_lab
    require_lab()
    with HostLab(2) as the_lab:
        yield the_lab


def profile(lab, name, weights, model=None, extra=()):
    model = model or next(iter(weights))
    return write_profile(lab, name, [
        "[target]", f"hosts = {json.dumps(HOSTS)}", f'name = "{name}"',
        "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{model}"',
        *extra, "[weights]", *(f'"{k}" = "local:{v}"' for k, v in weights.items())])


def on_host(lab, host, path):
    return Path(lab.home(host)) / path[len("/root/"):]


def tree(root):
    """{relative path: bytes} of every regular file under `root`, llmfab's own names aside."""
    out = {}
    for top, _, names in os.walk(root):
        for n in names:
            p = Path(top) / n
            rel = str(p.relative_to(root))
            if n == ".llmfab-verified.json" or n == ".llmfab-manifest.json" or n.endswith(".llmfab-part"):
                continue
            out[rel] = p.read_bytes()
    return out


def keys_of(lab, host):
    p = Path(lab.home(host)) / ".ssh" / "authorized_keys"
    return [l for l in (p.read_text().splitlines() if p.exists() else []) if "llmfab-pull:" in l]


def test_two_pulls_at_once_leave_each_other_alone(lab):
    src = make_model(Path(lab.root) / "src" / "big", 64, 2)
    small = Path(lab.root) / "src" / "other"
    small.mkdir(parents=True)
    (small / "config.json").write_text("{}\n")
    a = profile(lab, "pa", {"/root/models/a": src})
    b = profile(lab, "pb", {"/root/models/b": small})
    a_again = profile(lab, "pa2", {"/root/models/a": src})
    fab(lab, "pull", profile=b)  # b is there: its next pull is a no-op
    bg = Background(lab, "pull", profile=a)
    try:
        # The running pull has authorised its key on both hosts; hold it there (SIGSTOP) while
        # the other pulls run, so what they do to it shows.
        wait_for(lambda: all(keys_of(lab, h) for h in HOSTS), 60, "pull a's key on both hosts")
        bg.proc.send_signal(signal.SIGSTOP)
        mine = {h: keys_of(lab, h) for h in HOSTS}
        r = fab(lab, "pull", profile=b)  # another destination: runs, a no-op
        assert "up to date: 0 bytes sent" in r.stdout + r.stderr
        assert {h: keys_of(lab, h) for h in HOSTS} == mine, "pull b removed pull a's key"
        r = fab(lab, "pull", profile=a_again, code=1)  # the same destination: refused in words
        text = flat(r.stdout + r.stderr)
        assert "/root/models/a is being written by pull " in text, text
        assert "wait for it to end, then pull again" in text, text
        assert {h: keys_of(lab, h) for h in HOSTS} == mine, "the refused pull removed pull a's key"
        bg.proc.send_signal(signal.SIGCONT)
        assert bg.finish(timeout=300) == 0, "\n".join(bg.out + bg.err)
    finally:
        bg.proc.send_signal(signal.SIGCONT)
        bg.close()
    for h in HOSTS:
        assert tree(on_host(lab, h, "/root/models/a")) == tree(src)
        assert keys_of(lab, h) == [], h
    fab(lab, "pull", profile=a_again)  # a's lock went with its pull


def test_a_local_source_arrives_whole_or_is_refused_naming_the_file(lab):
    src = Path(lab.root) / "src" / "whole"
    (src / "real" / "deep").mkdir(parents=True)
    (src / ".hidden").mkdir()
    (src / "config.json").write_text('{"a": 1}\n')
    (src / "manifest.json").write_text('{"the model": "its own manifest"}\n')
    (src / ".hidden" / "notes.txt").write_text("a dot-directory's file\n")
    (src / "real" / "deep" / "w.bin").write_bytes(os.urandom(5000))
    os.symlink("real", src / "linked")             # a symlinked subdirectory inside the source
    os.symlink("config.json", src / "alias.json")  # a link to a file inside
    p = profile(lab, "whole", {"/root/models/whole": src})
    r = fab(lab, "pull", "--json", profile=p)
    want = {"config.json": b'{"a": 1}\n', "manifest.json": b'{"the model": "its own manifest"}\n',
            ".hidden/notes.txt": b"a dot-directory's file\n", "alias.json": b'{"a": 1}\n',
            "real/deep/w.bin": (src / "real/deep/w.bin").read_bytes(),
            "linked/deep/w.bin": (src / "real/deep/w.bin").read_bytes()}
    for h in HOSTS:
        assert tree(on_host(lab, h, "/root/models/whole")) == want, h
        o = json.loads([l for l in r.stdout.splitlines() if f'"{h}"' in l][0])
        assert o["dirs"][0]["files"] == len(want), o
    # What cannot be copied as the engine would read it: refused (exit 2) naming it; no hang.
    outside = Path(lab.root) / "src" / "outside.txt"
    outside.write_text("not the model's\n")
    for name, make, words in (
            ("out.json", lambda q: os.symlink(outside, q), f"a symlink out of the source (to {outside})"),
            ("gone.json", lambda q: os.symlink("nothere.json", q), "a dangling link"),
            ("pipe", os.mkfifo, "a FIFO (named pipe)")):
        make(src / name)
        start = time.monotonic()
        r = fab(lab, "pull", profile=p, code=2, timeout=60)
        assert time.monotonic() - start < 30
        text = flat(r.stdout + r.stderr)
        assert f"{src}/{name}: {words}" in text, text
        os.unlink(src / name)


DRAFTER_ARGS = ['[server.args]', 'speculative-config = { method = "eagle3", model = "/root/models/m/drafter", '
                'num_speculative_tokens = 2 }']


def test_a_drafter_inside_the_model_directory_is_one_plan(lab):
    m = Path(lab.root) / "src" / "m"
    d = Path(lab.root) / "src" / "drafter"
    m.mkdir(parents=True)
    d.mkdir(parents=True)
    (m / "config.json").write_text('{"m": 1}\n')
    (m / "old.txt").write_text("in rev 1 only\n")
    (d / "config.json").write_text('{"d": 1}\n')
    (d / "w.safetensors").write_bytes(os.urandom(3000))
    p = profile(lab, "nested", {"/root/models/m": m, "/root/models/m/drafter": d}, extra=DRAFTER_ARGS)
    for _ in range(2):
        r = fab(lab, "pull", profile=p)
        assert "WARN" not in r.stdout + r.stderr, r.stdout + r.stderr
    (m / "old.txt").unlink()  # the outer source changes
    (m / "new.txt").write_text("rev 2\n")
    r = fab(lab, "pull", "--json", profile=p)
    assert "WARN" not in r.stderr, r.stderr
    for h in HOSTS:
        assert tree(on_host(lab, h, "/root/models/m/drafter")) == tree(d), h
        outer = tree(on_host(lab, h, "/root/models/m"))
        assert {k for k in outer if not k.startswith("drafter/")} == {"config.json", "new.txt"}, h
        o = json.loads([l for l in r.stdout.splitlines() if f'"{h}"' in l][0])
        assert o["removed"] == ["/root/models/m/old.txt"] and o["extra_files"] == [], o


def _change_keeping_mtime(path):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_source_changed_with_its_mtime_kept_fails_once_in_words_and_verify_rehashes(lab):
    src = make_model(Path(lab.root) / "src" / "mt", 8, 2)
    p = profile(lab, "mtime", {"/root/models/mt": src})
    fab(lab, "pull", profile=p)
    shard = sorted(src.glob("*.safetensors"))[0]
    _change_keeping_mtime(shard)
    for h in HOSTS:  # the hosts need it again: its hash as cached here is stale
        on_host(lab, h, f"/root/models/mt/{shard.name}").unlink()
    r = fab(lab, "pull", profile=p, code=1)
    text = flat(r.stdout + r.stderr)
    assert f"{shard}: the source changed while it was being read" in text, text
    assert "trying again" not in text, text  # not three corrupt copies
    r = fab(lab, "pull", profile=p)  # its cached hash was dropped: read again, copied
    for h in HOSTS:
        assert tree(on_host(lab, h, "/root/models/mt")) == tree(src), h
    _change_keeping_mtime(shard)
    fab(lab, "pull", "--verify", profile=p)  # --verify re-hashes the source too
    for h in HOSTS:
        assert tree(on_host(lab, h, "/root/models/mt")) == tree(src), h


def test_many_small_files_go_in_batches(lab):
    src = Path(lab.root) / "src" / "many"
    (src / "sub").mkdir(parents=True)
    for i in range(2000):
        (src / ("sub" if i % 2 else "") / f"f{i:05d}.txt").write_text(f"file {i}\n")
    p = profile(lab, "many", {"/root/models/many": src})
    start = time.monotonic()
    r = fab(lab, "pull", profile=p, timeout=300)
    took = time.monotonic() - start
    for h in HOSTS:
        assert tree(on_host(lab, h, "/root/models/many")) == tree(src), h
    assert "2000 files (0.0 MiB) from here in one batch" in flat(r.stderr + r.stdout), r.stderr[-2000:]
    assert took < 60, took  # one SSH exec per file took ~0.09 s each: 2 hosts x 2,000 files


def test_check_says_a_half_pulled_model_is_incomplete(lab):
    src = make_model(Path(lab.root) / "src" / "half", 4, 2)
    p = profile(lab, "half", {"/root/models/half": src})
    d = on_host(lab, "h1", "/root/models/half")
    # A pull cut short: the directory exists, one file only partly there.
    d.mkdir(parents=True)
    shard = sorted(src.glob("*.safetensors"))[0]
    (d / "config.json").write_bytes((src / "config.json").read_bytes())
    (d / f".{shard.name}.llmfab-part").write_bytes(shard.read_bytes()[:1000])
    r = fab(lab, "-H", "h1", "check", profile=p, code=1)
    text = flat(r.stdout)
    assert "server.model: /root/models/half is incomplete: 1 partial file of an unfinished pull" in text, text
    assert "fix: `fab pull`" in text
    fab(lab, "-H", "h1", "pull", profile=p)
    r = fab(lab, "-H", "h1", "check", profile=p, code=1)  # (no engine on the lab host: its FAIL)
    assert "OK   path     server.model: /root/models/half exists" in r.stdout, r.stdout
    (d / shard.name).unlink()  # a file the finished pull's record lists, gone
    r = fab(lab, "-H", "h1", "check", profile=p, code=1)
    assert "is incomplete: 1 of the 4 files its .llmfab-manifest.json lists missing" in flat(r.stdout), r.stdout


def test_the_space_error_names_the_margin(lab):
    src = make_model(Path(lab.root) / "src" / "space", 8, 1)
    p = profile(lab, "space", {"/root/models/space": src})
    models = on_host(lab, "h2", "/root/models")
    models.mkdir(parents=True, exist_ok=True)
    lab.exec("h2", ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", "/root/models"], check=True)
    try:  # 8 MiB fits in 32 MiB; with the 64 MiB a pull keeps free it does not
        r = fab(lab, "-H", "h2", "pull", profile=p, code=1)
    finally:
        lab.exec("h2", ["umount", "/root/models"], check=True)
    text = flat(r.stdout + r.stderr)
    assert "a pull keeps 64.0 MiB free beyond the files" in text, text
