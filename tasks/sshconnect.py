"""Open one Fabric connection the safe way: strict host keys, bounded, retried.

Fabric's Connection accepts any host key (AutoAddPolicy) and loads no known_hosts.
Here host keys are checked against ~/.ssh/known_hosts and the host's
UserKnownHostsFile (ssh_config), unknown keys are refused unless the user opted in
(`StrictHostKeyChecking accept-new|no` in ssh_config, or `--accept-new-host-keys`),
and transient failures (refused, reset, banner races) are retried for a bounded time.
"""
import os
import socket

import paramiko
from tenacity import retry, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_fixed, wait_random

from .errors import HostUnreachable

DEFAULT_TIMEOUT = 10
RETRY_BUDGET_S = 15


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname, key):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class _Reject(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


class _Transient(Exception):
    pass


def _known_hosts_files(ssh_config):
    files = ["~/.ssh/known_hosts"]
    value = ssh_config.get("userknownhostsfile")
    if value:
        files = value if isinstance(value, list) else value.split()
    return [os.path.expanduser(f) for f in files]


def harden(cxn, accept_new=False):
    """Replace Fabric's accept-anything policy on cxn and on its ProxyJump gateways."""
    strict = str(cxn.ssh_config.get("stricthostkeychecking", "yes")).lower()
    files = _known_hosts_files(cxn.ssh_config)
    for f in files:
        if os.path.exists(f):
            cxn.client.load_host_keys(f)
    if accept_new or strict in ("accept-new", "no", "off"):
        cxn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        if not os.path.exists(files[0]):
            os.makedirs(os.path.dirname(files[0]), mode=0o700, exist_ok=True)
            open(files[0], "a").close()
        cxn.client.load_host_keys(files[0])  # so accepted keys are saved there
    else:
        cxn.client.set_missing_host_key_policy(_Reject())
    if hasattr(cxn.gateway, "client"):
        harden(cxn.gateway, accept_new)


def _describe(cxn):
    return f"{cxn.user}@{cxn.host}:{cxn.port}"


def open_connection(name, config, *, timeout=None, accept_new=False):
    """An open, host-key-checked fabric.Connection to `name`, or HostUnreachable."""
    from fabric import Connection

    cxn = Connection(name, config=config)
    timeout = timeout or cxn.connect_timeout or DEFAULT_TIMEOUT
    cxn.connect_timeout = timeout
    cxn.connect_kwargs.pop("timeout", None)
    cxn.connect_kwargs.setdefault("banner_timeout", timeout)
    cxn.connect_kwargs.setdefault("auth_timeout", timeout)
    harden(cxn, accept_new)

    @retry(retry=retry_if_exception_type(_Transient), reraise=True,
           stop=stop_after_delay(RETRY_BUDGET_S) | stop_after_attempt(4),
           wait=wait_fixed(0.5) + wait_random(0, 0.5))
    def attempt():
        try:
            cxn.open()
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionResetError,
                ConnectionRefusedError, EOFError) as e:
            cxn.client.close()
            raise _Transient(str(e) or type(e).__name__) from e

    try:
        attempt()
    except _Transient as e:
        raise HostUnreachable(f"cannot connect to {_describe(cxn)}: {e}") from None
    except UnknownHostKey as e:
        raise HostUnreachable(
            f"host key of {e.hostname} is not in known_hosts ({', '.join(_known_hosts_files(cxn.ssh_config))}); "
            f"nothing was run there. Verify the key, then trust it with "
            f"`ssh-keyscan -p {cxn.port} {cxn.host} >> ~/.ssh/known_hosts`, or set "
            f"`StrictHostKeyChecking accept-new` for this host in your ssh config"
        ) from None
    except paramiko.BadHostKeyException as e:
        raise HostUnreachable(
            f"host key of {e.hostname} does NOT match known_hosts: possible man-in-the-middle; "
            "nothing was run there. If the host was reinstalled, remove its old key with "
            f"`ssh-keygen -R {e.hostname}`") from None
    except paramiko.AuthenticationException as e:
        raise HostUnreachable(f"authentication to {_describe(cxn)} failed: {e}; check User/IdentityFile "
                              "in your ssh config, or pass -i KEY") from None
    except (socket.timeout, TimeoutError) as e:
        raise HostUnreachable(f"connecting to {_describe(cxn)} timed out after {timeout} s") from None
    except (paramiko.SSHException, OSError) as e:
        raise HostUnreachable(f"cannot connect to {_describe(cxn)}: {e}") from None
    return cxn
