"""The host's words for what went wrong: HostError (an expected failure, reported as a message),
Damaged (a state file that is not what llmfab wrote), and how a process ended or an OSError
happened in the one wording every llmfab message uses. Standard library only (ships to hosts)."""


class HostError(Exception):
    """An expected failure, reported to llmfab as a message (not a traceback)."""

    def __init__(self, message, kind="failed", **data):
        super().__init__(message)
        self.kind = kind
        self.data = data


def signal_name(num):
    """SIGKILL for 9; `signal 77` for a number with no name."""
    import signal
    try:
        return signal.Signals(num).name
    except ValueError:
        return "signal %d" % num


def exit_words(returncode):
    """How a process ended, in the one wording every llmfab message uses (status, releases,
    explanations, the supervisor's restart marker): `exited with status 3`, `killed by SIGKILL`.
    `returncode` as Popen gives it (negative: the signal)."""
    if returncode is None:
        return "ended with no exit status"
    if returncode < 0:
        return "killed by " + signal_name(-returncode)
    return "exited with status %d" % returncode


# What an OSError (a socket, a file, a URL) means, in the words a person reads: never Python's
# "[Errno 111] Connection refused" or "<urlopen error ...>". errno values: errno(3) / Linux.
ERRNO_WORDS = {
    "ECONNREFUSED": "connection refused",
    "ETIMEDOUT": "timed out",
    "EHOSTUNREACH": "no route to host",
    "EHOSTDOWN": "host is down",
    "ENETUNREACH": "network unreachable",
    "ECONNRESET": "connection reset",
    "ECONNABORTED": "connection aborted",
    "EPIPE": "connection closed",
    "EADDRINUSE": "address already in use",
    "EADDRNOTAVAIL": "address not available on this host",
    "ENOENT": "no such file or directory",
    "EACCES": "permission denied",
    "ENOSPC": "no space left on device",
}
# Errors with no errno, by type name (http.client's, without importing it): what happened.
TYPE_WORDS = {
    "RemoteDisconnected": "the server closed the connection without answering",
    "IncompleteRead": "the answer ended early",
    "BadStatusLine": "not an HTTP answer",
    "LineTooLong": "not an HTTP answer (a line too long)",
}


def error_words(e):
    """One failure in words for a human line (and an `error` string in JSON): `connection
    refused`, `timed out`, `no route to host`, `name not resolved`; from the errno or the
    exception's type, never its repr. A URLError is worded by the error it wraps."""
    import _socket  # the C module: socket.py's enums cost ~5 ms at import
    import errno
    for _ in range(4):  # URLError(reason=OSError(...)), at most a few deep
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            e = reason
        elif isinstance(reason, str) and isinstance(e, OSError) and e.errno is None:
            return reason  # URLError("unknown url type: ...")
        else:
            break
    if isinstance(e, _socket.gaierror):
        return "name not resolved"
    if isinstance(e, (_socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, OSError) and isinstance(e.errno, int) and e.errno > 0:
        words = ERRNO_WORDS.get(errno.errorcode.get(e.errno, ""))
        if words:
            return words
        if e.strerror:
            return e.strerror[:1].lower() + e.strerror[1:]
    words = TYPE_WORDS.get(type(e).__name__)
    if words:
        return words
    return str(e).strip() or ("connection closed" if isinstance(e, EOFError) else type(e).__name__)


class Damaged(HostError):
    """A state file llmfab wrote (server.json, a release's exit.json, ...) that is there but is
    not the JSON object it wrote: a disk that filled, an editor, a hand. Never read as absent
    (a running server would look "not deployed"), never a traceback."""

    def __init__(self, path, why):
        super().__init__("%s is damaged (%s): llmfab wrote it as a JSON object and cannot tell what it "
                         "held, so nothing was changed; move it aside and run the task again (`fab stop` "
                         "then ends this deployment's processes by their identity)"
                         % (path, why), kind="damaged", path=path)
