"""All I/O with hosts: SSH connections (strict host keys), the host agent, file pushes.

One SSH connection per host per task, and on it one remote command: the profile's
Python running the host agent (the host/ packages of tasks/) from the copy cached on the host,
sent over stdin only when the host lacks that exact version (tasks/transport/agent_code.py).
Every later request is a JSON line on that same channel. Files are pushed with SFTP on the
same connection. The `local` host runs the very same agent as a subprocess.
"""
import io
import json
import socket
import subprocess
import tempfile
import threading
from typing import Any, Optional

from .agent_code import AGENT_FLAGS, TASKS, bootstrap, payload
from ..errors import OperationFailed
from ..base.host.hosterrors import error_words

LOCAL_NAMES = ("local",)
DEFAULT_CONNECT_TIMEOUT = 10
AGENT_PUT_MAX = 4 << 20  # bytes; put() sends larger files by SFTP (base64 JSON is held in memory)

class ConnectionLost(OperationFailed):
    """The SSH connection (or the agent on it) went away mid-task; callers may reconnect."""


class AgentError(OperationFailed):
    """The agent answered with an error (`kind` says which: lock_held, launch_failed, ...)."""

    def __init__(self, message, kind="failed", data=None):
        super().__init__(message)
        self.kind = kind
        self.data = data or {}


class AgentStartFailed(OperationFailed):
    """The profile's Python could not run the agent on the host."""


def is_local(name):
    return name in LOCAL_NAMES


class _SshStream:
    """The agent's stdin and stdout on its SSH channel, read by lines.

    Not paramiko's ChannelFile: its __del__ flushes its write buffer, which fails noisily
    ("Exception ignored in BufferedFile.__del__ ... I/O operation on closed file") when an
    interrupted task's channel is collected at exit after that buffer."""

    def __init__(self, chan):
        self._chan = chan
        self._buf = bytearray()

    def write(self, data):
        self._chan.sendall(data)

    def flush(self):
        pass

    def readline(self):
        while True:
            end = self._buf.find(b"\n") + 1
            if end:
                line = bytes(self._buf[:end])
                del self._buf[:end]
                return line
            data = self._chan.recv(65536)
            if not data:  # EOF: what is left, then b""
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += data


class _Channel:
    """Request/response over a byte stream pair, one JSON object per line."""

    def __init__(self, wfile, rfile, describe):
        self._w, self._r, self._describe = wfile, rfile, describe
        self._lock = threading.Lock()

    def request(self, req):
        with self._lock:
            self.send(json.dumps(req).encode() + b"\n")
            return self.receive()

    def send(self, data):
        try:
            self._w.write(data)
            self._w.flush()
        except (OSError, EOFError, socket.timeout) as e:
            raise ConnectionLost(f"connection lost: {error_words(e)}") from e

    def receive_line(self):
        try:
            line = self._r.readline()
        except (OSError, EOFError, socket.timeout) as e:
            raise ConnectionLost(f"connection lost: {error_words(e)}") from e
        if not line:
            raise ConnectionLost(self._describe())
        return line

    def receive(self):
        return json.loads(self.receive_line())

    def receive_first(self, limit=200):
        """The agent's first message. A shell start-up file that prints to stdout (a banner in
        ~/.bashrc) writes before the agent does: skip such lines, and say so if nothing else
        comes."""
        noise = []
        for _ in range(limit):
            line = self.receive_line()
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict):
                return msg
            noise.append(line.decode("utf-8", "replace").rstrip())
        raise AgentStartFailed("the host printed text instead of starting the agent (does a shell "
                               "start-up file such as ~/.bashrc print to stdout?): "
                               + " | ".join(noise[:3]))


class Host:
    """One host, named as the user wrote it; owns its connection and agent."""

    def __init__(self, name, *, config=None, python="python3", connect_timeout=None,
                 accept_new_host_keys=False):
        self.name = name
        self.local = is_local(name)
        self.config = config
        self.python = python
        self.connect_timeout = connect_timeout
        self.accept_new_host_keys = accept_new_host_keys
        self.cxn: Any = None                             # fabric Connection, once connected
        self.hello: Optional[dict] = None                # the agent's hello record, once started
        self._chan: Optional[_Channel] = None
        self._ssh_chan: Any = None                       # paramiko Channel of the agent's command
        self._proc: Optional[subprocess.Popen] = None    # the agent here (a local host)
        self._sftp: Any = None
        self.stats = {"connections": 0, "commands": 0, "requests": 0}
        self.code_dir = TASKS  # whose host/ packages are the agent (tests point it at a modified copy)

    # -- connection -------------------------------------------------------------------
    def connect(self):
        if self.local or (self.cxn is not None and self.cxn.is_connected):
            return
        from .ssh import open_connection
        self.cxn = open_connection(self.name, self.config, timeout=self.connect_timeout,
                                   accept_new=self.accept_new_host_keys)
        self.stats["connections"] += 1

    def close(self):
        self._chan = None
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:  # a pipe: Popen(stdin=PIPE) in start()
                    proc.stdin.close()  # the agent sees EOF and ends
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
            if self._stderr is not None:
                self._stderr.close()  # the local agent's stderr file: not left to the garbage collector
        ssh_chan, self._ssh_chan = self._ssh_chan, None
        if ssh_chan is not None:
            try:
                ssh_chan.close()  # the agent sees EOF and ends
            except Exception:
                pass
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:
                pass
            self._sftp = None
        if self.cxn is not None:
            try:
                self.cxn.close()
            except Exception:
                pass
            self.cxn = None

    def reconnect(self):
        self.close()
        self.start()

    # -- agent --------------------------------------------------------------------------
    def start(self):
        """Connect if needed and start the agent; returns its hello record."""
        if self._chan is not None:
            return self.hello
        self.connect()
        code = payload(self.code_dir)
        argv = [self.python, *AGENT_FLAGS, "-c", bootstrap(), code.digest]
        self.stats["commands"] += 1
        if self.local:
            self._stderr = tempfile.TemporaryFile()
            try:
                # its own session: a Ctrl-C at the terminal reaches llmfab alone, which stops
                # what runs and puts back what ran before through this agent (as over SSH,
                # where no remote agent sees the terminal's signals); it ends when its stdin closes
                self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=self._stderr, start_new_session=True)
            except OSError as e:
                raise AgentStartFailed(f"cannot run server.python {self.python!r} here: {e.strerror}")
            self._chan = _Channel(self._proc.stdin, self._proc.stdout, self._local_death)
        else:
            from .ssh import exec_channel
            try:
                ssh_chan = exec_channel(self.cxn, argv)
            except Exception as e:
                raise ConnectionLost(f"cannot start a command: {error_words(e)}") from e
            self._ssh_chan = ssh_chan
            stream = _SshStream(ssh_chan)
            self._chan = _Channel(stream, stream, self._ssh_death)
        try:
            first = self._chan.receive_first()
            if first.get("need"):  # the host lacks this version of the agent's code
                self._chan.send(code.line)
                first = self._chan.receive()
            if not first.get("ok", True) or "result" not in first:
                raise AgentStartFailed(f"the host agent did not start: {first.get('error', first)}")
            self.hello = first["result"]
        except ConnectionLost as e:
            self._chan = None
            msg = str(e)
            if msg.startswith("exit "):
                raise AgentStartFailed(
                    f"server.python {self.python!r} could not run on this host ({msg}); "
                    "check that the path exists there and is Python >= 3.9") from None
            raise
        except BaseException:
            # No half-started agent: the next call starts afresh instead of finding a
            # channel without a hello.
            self._chan = None
            raise
        return self.hello

    def _local_death(self):
        proc = self._proc
        if proc is None:
            return "connection closed"
        code = proc.wait()
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace").strip()
        return f"exit {code}: {err[-1500:]}"

    def _ssh_death(self):
        chan = self._ssh_chan
        if chan is None:
            return "connection closed"
        if chan.status_event.wait(2) and chan.exit_status_ready():
            err = b""
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            text = err.decode("utf-8", "replace").strip()[-1500:]
            return f"exit {chan.recv_exit_status()}: {text}"
        return "connection closed"

    def call(self, op, timeout=None, **kw):
        """One agent request; returns its result or raises AgentError / ConnectionLost."""
        if self._chan is None:
            self.start()
        chan = self._chan
        assert chan is not None  # start() makes it or raises
        if not self.local:
            self._ssh_chan.settimeout(timeout)
        self.stats["requests"] += 1
        resp = chan.request(dict(kw, op=op))
        if resp.get("ok"):
            return resp["result"]
        raise AgentError(resp.get("error", "?"), resp.get("kind", "failed"), resp.get("data"))

    def batch(self, calls, timeout=None):
        """{name: (op, kwargs)} in one request (the agent's op `batch`): {name: its result}.
        They run one after the other on the host, in the order given, and the first failure
        ends the batch: its AgentError is raised as that call's own (its data's `batch_call`
        names it), and nothing after it ran."""
        return self.call("batch", calls={name: dict(kw, op=op) for name, (op, kw) in calls.items()},
                         timeout=timeout)

    def stream(self, argv):
        """A second command on this host, fed bytes from here (tasks/transport/stream.py):
        a session on this connection, or a local process."""
        from .stream import CommandStream
        return CommandStream(self, argv)

    def server_key(self):
        """(type, base64) of the SSH host key this connection checked (None for `local`)."""
        if self.local:
            return None
        from .ssh import server_key
        self.connect()
        return server_key(self.cxn)

    # -- files --------------------------------------------------------------------------
    def put(self, data: bytes, path: str, mode: int = 0o644):
        """Write bytes to an absolute path on the host, byte for byte, then set its mode.

        Files up to AGENT_PUT_MAX bytes go over the agent's channel (op put_file), so a
        deploy starts no second remote command: sshd would start the SFTP subsystem through
        the user's shell too (~0.15 s where ~/.bashrc runs `pyenv init`, measured in
        benchmarks/RESULTS.md). Larger files go by SFTP on the same connection.
        """
        if self.local:
            from ..base.host.safefile import replace
            replace(path, data, mode)  # never through a link or onto a FIFO planted at `path`
            return
        if len(data) <= AGENT_PUT_MAX:
            import base64
            self.call("put_file", path=path, mode=mode, data=base64.b64encode(data).decode("ascii"))
            return
        try:
            if self._sftp is None:
                self._sftp = self.cxn.sftp()
            self._sftp.putfo(io.BytesIO(data), path, confirm=True)
            self._sftp.chmod(path, mode)
        except (OSError, EOFError) as e:
            text = getattr(e, "strerror", None) or str(e) or type(e).__name__
            # A full disk reaches SFTP as a bare "Failure", or (pipelined writes) as a file
            # shorter than sent: paramiko's "size mismatch in put!".
            if "Failure" in text or "size mismatch" in text or getattr(e, "errno", None) == 28:
                text += " (is the disk full?)"
            raise OperationFailed(f"could not write {path}: {text}") from e
