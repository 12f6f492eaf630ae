"""Logs, releases, rollback and the deploy lock (issue 3).

Unit tests cover the pure parts (line assembly, UTF-8 across chunk boundaries, the
host's backwards tail, prune, the releases table); the e2e tests run the real `fab`
against real sshd hosts (tests/hostlab.py) with a tiny `engine = "command"` server.

Here: the rest; the tests on lab hosts are in tests/lab/test_logs_releases_e2e.py."""
import base64
import io
import os
import random
import threading
import pytest
from tasks.releases import describe_end, previous_release, rows, stamp_time, table_lines
from tasks.steps.host import logs
from tasks.release.host import release_dirs
from tasks.options import TailLogOptions
from tasks.log_lines import LineAssembler, is_fatal, utf8_boundary
from tasks.errors import UsageError


SAMPLE = ("plain line\nünïcödé — 日本語 🚀\nbad \xff\xfe bytes\n".encode("utf-8", "surrogateescape")
          .replace(b"\xc3\xbf\xc3\xbe", b"\xff\xfe") + b"no newline yet")


def reference_lines(data):
    *lines, rest = data.split(b"\n")
    return [l.decode("utf-8", "replace") for l in lines], rest


@pytest.mark.parametrize("seed", range(20))
def test_assembler_any_chunking_gives_the_same_lines(seed):
    rnd = random.Random(seed)
    lines, rest = reference_lines(SAMPLE)
    asm, got, i = LineAssembler(), [], 0
    while i < len(SAMPLE):
        n = rnd.randint(1, 7)
        got += asm.feed(SAMPLE[i:i + n])
        i += n
    assert got == lines
    assert asm.flush() == rest.decode()
    assert asm.flush() is None


def test_assembler_every_split_point_of_a_multibyte_character():
    data = "€𝄞é\n".encode()
    for cut in range(1, len(data)):
        asm = LineAssembler()
        assert asm.feed(data[:cut]) == []
        assert asm.feed(data[cut:]) == ["€𝄞é"]


def test_assembler_invalid_utf8_becomes_replacement_chars_and_crlf_is_trimmed():
    asm = LineAssembler()
    assert asm.feed(b"a\xffb\r\nc\xe2\x82\n") == ["a\ufffdb", "c\ufffd"]


def test_assembler_long_partial_line_is_cut_at_a_character_boundary():
    asm = LineAssembler(max_partial=10)
    out = asm.feed("aaaaaaaaa€€".encode())  # the first € straddles byte 10
    assert out == ["aaaaaaaaa"]
    assert asm.feed(b"\n") == ["€€"]
    assert "\ufffd" not in "".join(out)


@pytest.mark.parametrize("text,limit,cut", [
    ("abcdef", 4, 4), ("ab€", 3, 2), ("ab€", 4, 2), ("ab€", 5, 5), ("a𝄞", 2, 1), ("a𝄞", 5, 5),
])
def test_utf8_boundary(text, limit, cut):
    assert utf8_boundary(text.encode(), limit) == cut


def test_is_fatal_uses_logscan_patterns():
    assert is_fatal("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert is_fatal("OSError: [Errno 98] Address already in use")
    assert not is_fatal("INFO Loading weights took 3.2 s")


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream,multi", [(_Tty(), False), (io.StringIO(), True)])
def test_fatal_lines_are_red_on_a_terminal_only_and_hosts_prefix_with_several(stream, multi):
    from tasks.tail_log import Printer
    from tasks.output import Reporter
    printer = Printer(Reporter(["h1", "h2"], stream=stream), "h1", multi, threading.Event())
    printer.show(["INFO fine", "RuntimeError: Engine core initialization failed. See root cause"])
    out = stream.getvalue().splitlines()
    if multi:
        assert out == ["[h1] INFO fine", "[h1] RuntimeError: Engine core initialization failed. See root cause"]
    else:
        assert out == ["INFO fine", "\x1b[31mRuntimeError: Engine core initialization failed. See root cause\x1b[0m"]


def test_tail_log_options_validate_locally():
    opts = TailLogOptions.from_flags(lines="7", grep="a|b", release=None)
    assert opts.lines == 7 and opts.regex.pattern == "a|b"
    for bad in ({"grep": "("}, {"lines": "-1"}, {"lines": "x"}, {"release": "../x"},
                {"release": "a/b"}, {"release": ".."}):
        with pytest.raises(UsageError):
            TailLogOptions.from_flags(**dict({"lines": 5}, **bad))


@pytest.mark.parametrize("block", [1, 3, 16, 64 * 1024])
def test_last_lines_matches_a_forward_reading(monkeypatch, block):
    monkeypatch.setattr(logs, "BLOCK", block)
    rnd = random.Random(block)
    body = b"".join(b"%d %s\n" % (i, b"x" * rnd.randint(0, 40)) for i in range(200)) + b"part"
    f = io.BytesIO(body)
    end = logs.line_end(f, len(body))
    assert end == len(body) - 4
    lines = body[:end].split(b"\n")[:-1]
    for n in (0, 1, 5, 199, 200, 500):
        data, clipped = logs.last_lines(f, end, n)
        assert data == b"".join(l + b"\n" for l in lines[len(lines) - min(n, 200):]) and not clipped
    odd = lambda l: int(l.split(b" ")[0]) % 2 == 1  # noqa: E731
    data, _ = logs.last_lines(f, end, 3, odd)
    assert data.split(b"\n")[:-1] == [l for l in lines if odd(l)][-3:]


def test_last_lines_clips_at_max_bytes(monkeypatch):
    monkeypatch.setattr(logs, "BLOCK", 8)
    body = b"".join(b"%03d\n" % i for i in range(100))
    data, clipped = logs.last_lines(io.BytesIO(body), len(body), 50, max_bytes=20)
    assert clipped and len(data) <= 20 + 4 and data.endswith(b"099\n")
    big = b"y" * 100 + b"\n"
    data, clipped = logs.last_lines(io.BytesIO(big), len(big), 5, max_bytes=30)
    assert clipped and data == b"y" * 29 + b"\n"


def _deployment(tmp_path, names, current):
    ddir = tmp_path / "dep"
    for n in names:
        (ddir / "releases" / n).mkdir(parents=True)
        (ddir / "releases" / n / "launch.py").write_text("")
    if current:
        os.symlink(f"releases/{current}", ddir / "current")
    return str(ddir)


def test_log_tail_and_read_from_offsets(tmp_path):
    ddir = _deployment(tmp_path, ["20250101T000000Z"], "20250101T000000Z")
    log = os.path.join(ddir, "releases", "20250101T000000Z", "server.log")
    with open(log, "wb") as f:
        f.write(b"one\ntwo\nthr")
    r = logs.op_log_tail(**{"deploy_dir": ddir, "lines": 1})
    assert base64.b64decode(r["data"]) == b"two\n" and base64.b64decode(r["partial"]) == b"thr"
    assert r["end"] == 8 and r["release"] == "20250101T000000Z"
    r = logs.op_log_read(**{"deploy_dir": ddir, "release": r["release"], "offset": 8, "wait": 0})
    assert base64.b64decode(r["data"]) == b"thr" and r["offset"] == 11
    r2 = logs.op_log_read(**{"deploy_dir": ddir, "release": r["release"], "offset": 11, "wait": 0.1})
    assert r2["data"] == "" and r2["offset"] == 11
    r3 = logs.op_log_read(**{"deploy_dir": ddir, "release": r["release"], "offset": 99})
    assert r3["truncated"] and base64.b64decode(r3["data"]) == b"one\ntwo\nthr"
    with pytest.raises(logs.HostError) as e:
        logs.op_log_tail(**{"deploy_dir": ddir, "release": "20990101T000000Z"})
    assert e.value.kind == "no_release" and e.value.data["available"] == ["20250101T000000Z"]
    with pytest.raises(logs.HostError) as e:
        logs.op_log_tail(**{"deploy_dir": ddir, "grep": "("})
    assert e.value.kind == "bad_grep"


NAMES = ["20250101T000000Z", "20250101T000000Z-2", "20250102T000000Z", "20250103T000000Z",
         "20250104T000000Z", "20250105T000000Z"]


@pytest.mark.parametrize("current", [NAMES[0], NAMES[1], NAMES[3], NAMES[5]])
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_prune_never_removes_current_or_the_one_before(tmp_path, current, keep):
    ddir = _deployment(tmp_path, NAMES, current)
    removed = release_dirs.prune(ddir, keep)
    left = release_dirs.releases_sorted(ddir)
    idx = NAMES.index(current)
    protected = {current, NAMES[max(idx - 1, 0)]}
    assert protected <= set(left)
    assert len(left) == max(keep, len(protected))
    assert removed == [n for n in NAMES if n not in protected][:len(removed)]  # oldest first
    assert sorted(removed + left) == sorted(NAMES)


def test_prune_keeps_newest_n(tmp_path):
    ddir = _deployment(tmp_path, NAMES, NAMES[-1])
    assert release_dirs.prune(ddir, 3) == NAMES[:3]
    assert release_dirs.releases_sorted(ddir) == NAMES[3:]


def test_describe_end():
    assert describe_end({"running": True, "pid": 7}) == "running (pid 7)"
    assert describe_end({"exit": {"returncode": 0}}) == "exited with status 0"
    assert describe_end({"exit": {"returncode": 3}}) == "exited with status 3"
    assert describe_end({"exit": {"returncode": -15}}) == "killed by SIGTERM"
    assert describe_end({"exit": {"returncode": -9}}) == "killed by SIGKILL"
    assert describe_end({"exit": {"returncode": 1, "stopped": {"by": "fab stop", "pid": 7}}}) \
        == "stopped by fab stop: exited with status 1"  # however it exited while stopping: not a failure
    assert describe_end({"log_bytes": None}) == "never started"
    assert describe_end({"log_bytes": 10}) == "gone (no exit record)"


def test_previous_release_skips_releases_that_never_ran():
    rel = [{"release": "a", "log_bytes": 5}, {"release": "b", "log_bytes": None},
           {"release": "c", "log_bytes": 1}, {"release": "d", "log_bytes": 1}]
    assert previous_release(rel, "c") == "a"
    assert previous_release(rel, "d") == "c"
    assert previous_release(rel, "a") is None
    assert previous_release(rel, None) is None


def test_rows_and_table():
    listing = {"releases": [
        {"release": "20250101T120000Z", "current": False, "profile_sha256": "ab" * 32,
         "log_bytes": 2048, "exit": {"returncode": -15, "ended_at": "x"}},
        {"release": "20250102T120000Z-2", "current": True, "profile_sha256": None,
         "log_bytes": 5, "running": True, "pid": 9, "started_at": "2025-01-02T12:00:05+00:00"}]}
    recs = rows(listing)
    assert recs[0]["profile_sha"] == "ab" * 6 and recs[0]["started_at"] == stamp_time("20250101T120000Z")
    assert recs[1]["started_at"] == "2025-01-02T12:00:05+00:00" and recs[1]["ended"] == "running (pid 9)"
    lines = table_lines(recs)
    assert lines[1].startswith("   20250101T120000Z") and "killed by SIGTERM" in lines[1]
    assert lines[2].startswith("*  20250102T120000Z-2") and "2025-01-02 12:00:05Z" in lines[2]
    assert "2.0 KiB" in lines[1]


def test_saved_profile_gives_the_old_releases_readiness_settings(tmp_path):
    from tasks.releases import saved_profile
    from tasks.profile import load_profile
    (tmp_path / "helper.sh").write_text("#!/bin/sh\n")
    path = tmp_path / "old.toml"
    path.write_text("[target]\nname = \"d\"\n[server]\nengine = \"vllm\"\nmodel = \"/m\"\n"
                    "port = 9123\nfiles = [\"helper.sh\"]\n[server.args]\nserved-model-name = \"old\"\n"
                    "[server.env]\nTOKEN = { from_env = \"LLMFAB_TEST_TOKEN\" }\n"
                    "[ready]\nhealth_path = \"/ping\"\ntimeout = 77\n")
    old = load_profile(path, environ={"LLMFAB_TEST_TOKEN": "s3cret"})
    (tmp_path / "helper.sh").unlink()  # the local copy may be gone by rollback time
    back = saved_profile(old.resolved_toml, fallback=None)
    assert back is not None and "s3cret" not in old.resolved_toml
    assert (back.server.port, back.served_name, back.ready.health_path, back.ready.timeout) == \
        (9123, "old", "/ping", 77)
    assert saved_profile("not = [toml", fallback="F") == "F" and saved_profile(None, "F") == "F"


def test_previous_release_skips_one_that_failed_to_start():
    rels = [{"release": "r1", "log_bytes": 10}, {"release": "r2", "log_bytes": 10,
             "start_failed": {"rule": "cuda-oom"}}, {"release": "r3", "log_bytes": 10}]
    assert previous_release(rels, "r3") == "r1"
    assert describe_end(rels[1]) == "failed to start (cuda-oom)"
