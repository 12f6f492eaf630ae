"""One error root for llmfab; each leaf carries the exit code the CLI turns it into.

Messages name the file, key, host or value at fault and say what to do.
"""
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    UNREACHABLE = 3
    INTERRUPTED = 130


# What each code means to a user (docs/reference/cli.md is generated from it). With several
# hosts a task exits with the worst host's code.
EXIT_MEANINGS = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "the deployment or operation failed (server died, not ready in time, a "
                     "preflight FAIL, GPU memory not freed; status: not running or unhealthy)",
    ExitCode.BAD_INPUT: "bad input (profile, arguments): one line naming the file, key or flag; "
                        "nothing was done on any host",
    ExitCode.UNREACHABLE: "a host could not be reached or authenticated (an unknown host key "
                          "included)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); a server being waited on keeps running and "
                          "the lock is released. SIGTERM and SIGHUP end a task the same way, "
                          "exit 143 and 129 (128 + the signal)",
}


class LlmfabError(Exception):
    """Root of every error llmfab reports as a one-line message plus exit code."""

    code = ExitCode.FAILED

    def __init__(self, message, *, details=()):
        super().__init__(message)
        self.message = message
        self.details = tuple(details)  # extra lines (log excerpts) shown under the message
        # Fields this error adds to its host's --json object, after {host, ok, error, code}
        # (tasks/fleet/fanout.py error_record): a failed preflight's checks and findings, a
        # failed server's release, pid and fatal.
        self.json_extra = {}


class ProfileError(LlmfabError, ValueError):
    """The profile (or an argument) is invalid. Raised before any host is touched."""

    code = ExitCode.BAD_INPUT

    def __init__(self, path, key, expected, *, got=None):
        where = f"{path}: {key}" if key else f"{path}"
        msg = f"{where}: {expected}"
        if got is not None:
            msg += f" (got {got})"
        super().__init__(msg)
        self.path, self.key, self.expected = path, key, expected


class UsageError(LlmfabError, ValueError):
    """A bad command-line argument."""

    code = ExitCode.BAD_INPUT


class HostUnreachable(LlmfabError, ConnectionError):
    """A host could not be reached or authenticated."""

    code = ExitCode.UNREACHABLE


class OperationFailed(LlmfabError):
    """The deployment or operation failed on the host (server died, not ready, memory not freed)."""

    code = ExitCode.FAILED


class PreflightFailed(OperationFailed):
    """A preflight check failed; nothing was launched."""


class LockHeld(OperationFailed):
    """Another deploy/stop/rollback of the same deployment holds the lock (`holder`: who)."""

    holder = None

    @classmethod
    def naming(cls, holder, message):
        err = cls(message)
        err.holder = holder
        return err


class TaskFailed(LlmfabError):
    """Some host failed; each was reported with its reason as it happened. Carries the worst
    host's exit code (with several hosts, the worst code of them all: docs/reference/cli.md)."""

    def __init__(self, code):
        super().__init__("")
        self.code = ExitCode(code) if code in ExitCode._value2member_map_ else code


class Interrupted(LlmfabError):
    """Ctrl-C: what keeps running was already said; exit 130."""

    code = ExitCode.INTERRUPTED

    def __init__(self):
        super().__init__("")
