"""A failed connection in words a person reads ("connection refused", "timed out", "name not
resolved"), never Python's ("[Errno 111]", "URLError", "<urlopen error ...>"): the one helper
(tasks/base/host/hosterrors.py error_words) fed real exceptions from real sockets on this machine,
and each place a user reads it (the HTTP probe, a bench request, the smoke request, status)."""
import contextlib
import socket
import urllib.error
import urllib.request

import pytest

from tasks.measure.host import loadgen as bench
from tasks.steps.host import probe
from tasks.base.host.hosterrors import HostError, error_words
from tasks.status import Status, render

PYTHON_WORDS = ("Errno", "Error", "urlopen", "<", "None")


def human(text):
    return not any(w in text for w in PYTHON_WORDS)


@contextlib.contextmanager
def refused_port():
    """A port on 127.0.0.1 that nothing listens on (bound, so nobody else takes it meanwhile)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@contextlib.contextmanager
def silent_port():
    """A listening port whose connections are accepted by the kernel and never answered."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@contextlib.contextmanager
def binary_port():
    """A port that answers every connection with an HTTP/2 SETTINGS frame, as a gRPC server
    (a Ray worker, say) does: bytes that are no HTTP/1 status line."""
    import threading
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)

    def serve():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            with c:
                c.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x05\x00\x00@\x00\n")
                c.shutdown(socket.SHUT_WR)
                while c.recv(65536):  # until the client hangs up: closing with its request
                    pass              # unread would reset the connection instead
    threading.Thread(target=serve, daemon=True).start()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the real exception is the input
        return e
    raise AssertionError("no exception")


def test_real_socket_and_url_errors_in_words():
    with refused_port() as port:
        connect = raised(lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
        url = raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2))
    assert isinstance(url, urllib.error.URLError) and "Errno" in str(url)  # what Python says
    assert error_words(connect) == error_words(url) == "connection refused"
    with silent_port() as port:
        slow = raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.2))
    assert error_words(slow) == "timed out"
    unresolved = raised(lambda: socket.getaddrinfo("127.0.0.1", "no-such-service", type=socket.SOCK_STREAM))
    assert isinstance(unresolved, socket.gaierror) and error_words(unresolved) == "name not resolved"
    missing = raised(lambda: open("/nonexistent/llmfab"))
    assert error_words(missing) == "no such file or directory"
    assert error_words(EOFError()) == "connection closed"


def test_every_probe_and_request_words_a_refused_port():
    with refused_port() as port:
        status, body = probe.http_get(port, "/health")
        assert status is None and body.decode() == "connection refused"
        sample = bench.one_request(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"}, {}, 2)
        assert sample["ok"] is False and sample["error"] == "connection refused"
        with pytest.raises(HostError) as smoke:
            bench.op_smoke(**{"port": port, "model": "m"})
    assert str(smoke.value) == f"POST http://127.0.0.1:{port}/v1/completions failed: connection refused"
    with silent_port() as port:
        assert probe.http_get(port, "/health", timeout=0.2) == (None, b"timed out")


def test_a_port_that_answers_without_http_is_said_so_by_every_probe_never_raised():
    # CI: a deploy ended "error: BadStatusLine: <binary>" when something else held the port.
    with binary_port() as port:
        raw = raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2))
        assert type(raw).__name__ == "BadStatusLine"  # what Python raises: no OSError
        assert probe.http_get(port, "/health") == (None, b"not an HTTP answer")
        sample = bench.one_request(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"}, {}, 2)
        assert sample["ok"] is False and sample["error"] == "not an HTTP answer"
        with pytest.raises(HostError) as smoke:
            bench.op_smoke(**{"port": port, "model": "m"})
    assert str(smoke.value).endswith("failed: not an HTTP answer")


def test_status_line_of_a_server_whose_health_does_not_answer_names_no_python_value():
    rec = {"host": "h1", "running": True, "pid": 7, "release": "20260101T000000Z", "port": 8000,
           "health": "connection refused", "served_name": None, "gpus": None, "spec": None,
           "generation_tokens_per_s": None, "uptime_s": 5, "exit": None, "fatal": None, "deployed": True}
    head = render(Status(rec))[0]
    assert head == ("running: release 20260101T000000Z, pid 7, up 0m05s, port 8000, "
                    "health: no answer (connection refused)") and human(head), head
    rec.update(health=200, served_name=["a", "b"])
    assert render(Status(rec))[0].endswith("port 8000, health 200, models a, b")


def test_pull_without_ssh_keygen_says_so_in_words(tmp_path, monkeypatch):
    """No ssh-keygen on this machine (an empty PATH): the pull's line names the program and
    'no such file or directory', not Python's FileNotFoundError text."""
    import io

    from tasks.output import Reporter
    from tasks.weights import pull

    monkeypatch.setenv("PATH", str(tmp_path))
    out = io.StringIO()
    pull._grant({}, [], "p1", Reporter(stream=out), {})
    line = out.getvalue().strip()
    assert line == ("cannot make the pull's SSH key (ssh-keygen: no such file or directory); "
                    "every host gets the files from here"), line
