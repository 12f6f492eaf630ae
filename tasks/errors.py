"""One error root for llmfab; each leaf carries the exit code the CLI turns it into.

Messages name the file, key, host or value at fault and say what to do.
"""
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1        # the deployment or operation failed
    BAD_INPUT = 2     # profile or arguments; nothing was done on any host
    UNREACHABLE = 3   # a host could not be reached or authenticated
    INTERRUPTED = 130


class LlmfabError(Exception):
    """Root of every error llmfab reports as a one-line message plus exit code."""

    code = ExitCode.FAILED

    def __init__(self, message, *, details=()):
        super().__init__(message)
        self.message = message
        self.details = tuple(details)  # extra lines (log excerpts) shown under the message


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
    """Another deploy/stop/rollback of the same deployment holds the lock."""


class TaskFailed(LlmfabError):
    """Some host failed; each was reported with its reason as it happened. Carries the worst
    host's exit code (DESIGN: with several hosts, the worst code of them all)."""

    def __init__(self, code):
        super().__init__("")
        self.code = ExitCode(code) if code in ExitCode._value2member_map_ else code


class Interrupted(LlmfabError):
    """Ctrl-C: what keeps running was already said; exit 130."""

    code = ExitCode.INTERRUPTED

    def __init__(self):
        super().__init__("")
