"""A changed host key is refused, and the advice removes the entry where it really is: under
the name known_hosts stores it by (`[127.0.0.1]:PORT` for a host on another port than 22)
and in the file that holds it (`-f FILE`), not `ssh-keygen -R 127.0.0.1` on ~/.ssh/known_hosts.

The host on another port is a lab host reached through a plain TCP forwarder on 127.0.0.1."""
import socket
import threading
from pathlib import Path

from helpers import flat, write_profile


def forward(target):
    """A TCP forwarder 127.0.0.1:<port> -> target, in threads; returns (port, close)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    socks = [srv]

    def pipe(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve():
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            upstream = socket.create_connection(target)
            socks.extend([client, upstream])
            threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()

    def close():
        for s in socks:
            s.close()
    return srv.getsockname()[1], close


def test_a_changed_key_on_another_port_is_named_as_known_hosts_stores_it(lab, tmp_path):
    port, close = forward((lab.ip("h3"), 22))
    try:
        lines = [line.split() for line in Path(lab.known_hosts).read_text().splitlines()]
        wrong = next(parts[1:3] for parts in lines if parts[0] == lab.ip("h1"))  # h1's key, not h3's
        known = tmp_path / "other_known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {' '.join(wrong)}\n")
        block = next(b for b in Path(lab.ssh_config).read_text().split("\n\n") if b.startswith("Host h3\n"))
        block = block.replace("Host h3\n", "Host moved\n").replace(f"HostName {lab.ip('h3')}", "HostName 127.0.0.1")
        block = block.replace("Port 22", f"Port {port}").replace(str(lab.known_hosts), str(known))
        cfg = tmp_path / "ssh_config"
        cfg.write_text(block + "\n")
        prof = write_profile(lab, "hostkey-moved", [
            "[target]", 'hosts = ["moved"]', 'name = "hostkey-moved"', "[server]", 'engine = "command"',
            'command = ["python3", "-c", "pass"]', "port = 31866"])
        import subprocess
        import sys
        from hostlab import REPO
        r = subprocess.run([sys.executable, "-m", "fabric", "-S", str(cfg), "check", "--profile", str(prof)],
                           cwd=str(REPO), capture_output=True, text=True, timeout=120)
        assert r.returncode == 3, r.stdout + r.stderr
        text = flat(r.stdout + r.stderr)
        assert f"host key of [127.0.0.1]:{port} does NOT match {known}" in text, text
        assert f"`ssh-keygen -R '[127.0.0.1]:{port}' -f {known}`" in text, text
    finally:
        close()
