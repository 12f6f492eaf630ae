"""A second command on a host, fed bytes from here: a session on the host's own SSH
connection (no new login; tasks/transport/ssh.py `exec_channel`), or a process of its own
for the `local` host. `fab pull` streams a file's bytes into the host's receiver this way
(tasks/weights/send.py); the command's stdout, stderr and exit status come back once the
bytes end.
"""
import subprocess

from ..base.host.hosterrors import error_words


class CommandStream:
    """`argv` running on `host` (a started tasks.transport.agent.Host), its stdin ours."""

    def __init__(self, host, argv):
        self.local = host.local
        if self.local:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
        else:
            from .ssh import exec_channel
            host.connect()
            self.chan = exec_channel(host.cxn, argv)

    def send(self, data):
        """All of `data` to the command's stdin; OSError once the command has gone."""
        if self.local:
            self.proc.stdin.write(data)
        else:
            self.chan.sendall(data)

    def finish(self, broken=None):
        """Close its stdin, wait for it. -> (stdout, stderr, exit status); `broken`: the
        error that cut the sending short (its words stand for an empty stderr)."""
        if self.local:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            out, err = self.proc.communicate()
            return out, err, self.proc.returncode
        try:
            if broken is None:
                self.chan.shutdown_write()
            out = b"".join(iter(lambda: self.chan.recv(65536), b""))
            rc = self.chan.recv_exit_status()
            err = b""
            while self.chan.recv_stderr_ready():
                err += self.chan.recv_stderr(65536)
            return out, err or (error_words(broken).encode() if broken else b""), rc
        except OSError as e:
            return b"", error_words(e).encode(), -1
        finally:
            self.chan.close()
