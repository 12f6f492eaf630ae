"""Start the host agent on this machine (the `local` host: the real bootstrap, no SSH hop):
for tests/unit/test_agent_code.py and tests/lab/test_agent_over_ssh.py. And the agent's package
written out as a host holds it, for tests that import host modules the way a host does."""
import sys
from pathlib import Path

from tasks.transport.agent import Host
from tasks.transport.agent_code import HOST_PACKAGE, TASKS, host_files


def start(code_dir=TASKS):
    host = Host("local", python=sys.executable)
    host.code_dir = code_dir
    return host, host.start()


def host_package(dest):
    """Write llmfab_host/ (exactly what travels) under `dest`; -> `dest`, for sys.path."""
    for name, data in host_files():
        path = Path(dest) / HOST_PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(dest)
