"""Start the host agent on this machine (the `local` host: the real bootstrap, no SSH hop):
for tests/unit/test_agent_code.py and tests/lab/test_agent_over_ssh.py."""
import sys
from tasks.transport.agent import Host
from tasks.transport.agent_code import HOSTSIDE


def start(code_dir=HOSTSIDE):
    host = Host("local", python=sys.executable)
    host.code_dir = code_dir
    return host, host.start()
