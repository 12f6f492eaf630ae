"""Open one Fabric connection the safe way: strict host keys, bounded, retried.

Fabric's Connection accepts any host key (AutoAddPolicy) and loads no known_hosts.
Here host keys are checked against ~/.ssh/known_hosts (or the host's
UserKnownHostsFile) and /etc/ssh/ssh_known_hosts (or GlobalKnownHostsFile); unknown
keys are refused unless the user opted in (`StrictHostKeyChecking accept-new|no` in
ssh_config, or `--accept-new-host-keys`), and a key that CHANGED is always refused.
The same rules apply to every ProxyJump hop.

The connect timeout (default 10 s) is, in order: the caller's, `fab -t N`, the
host's ssh_config ConnectTimeout, Fabric's `timeouts.connect`. It bounds the TCP
connect, the SSH banner and authentication alike, so a host that accepts TCP and
never speaks fails within it. Refused/reset connections (sshd restarting, or
throttling a burst of connections with MaxStartups) are retried for at most
RETRY_BUDGET_S; a host that does not route or does not answer is not retried.
"""
import errno
import logging
import os
import socket
import stat
import threading
import time

import paramiko
from fabric import Connection

from ..errors import HostUnreachable
from ..base.host.hosterrors import error_words

DEFAULT_TIMEOUT = 10
RETRY_BUDGET_S = 15
TRANSIENT_ERRNOS = (errno.ECONNREFUSED, errno.ECONNRESET)

# Paramiko's transport thread logs failed handshakes with a traceback at ERROR; with no
# handler configured Python prints that to stderr. Our message says it in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_save_lock = threading.Lock()  # hosts accept new keys in parallel threads: append, one at a time


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname, key):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class _Reject(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Trust a key never seen before and APPEND it to known_hosts (one line).

    Paramiko's AutoAddPolicy rewrites the whole file from this client's copy, so
    parallel connections would overwrite each other's new keys.
    """

    def __init__(self, path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _save_lock:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def known_hosts_name(hostname, port):
    """The name known_hosts stores a host's key under, as OpenSSH writes it: `host` on port 22,
    `[host]:port` on any other (what `ssh-keygen -R` must be given)."""
    return hostname if not port or int(port) == 22 else f"[{hostname}]:{port}"


class _Transient(Exception):
    pass


def _files(ssh_config, key, default):
    value = ssh_config.get(key)
    if value:
        files = value if isinstance(value, list) else value.split()
    else:
        files = [default]
    return [os.path.expanduser(f) for f in files]


def _known_hosts_files(ssh_config):
    return _files(ssh_config, "userknownhostsfile", "~/.ssh/known_hosts")


_known_cache = {}  # path -> (its stat, paramiko.HostKeys): parsed once per task, not per host
_known_lock = threading.Lock()


def _known_hosts(path):
    """The keys a known_hosts file lists (None if there is none), parsed once per process while
    the file stays the same: every key line is decoded into a key object, ~70 us a line,
    which a long known_hosts file made each host's connection pay again."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _known_lock:
        hit = _known_cache.get(path)
        if hit is None or hit[0] != stamp:
            hit = _known_cache[path] = (stamp, paramiko.HostKeys(path))
    return hit[1]


def _prepare(cxn, timeout, accept_new):
    """Timeouts and host-key policy on cxn and on each of its ProxyJump gateways."""
    # A copy: connect_kwargs may be the config's own dict, shared by every host's thread.
    kwargs = dict(cxn.connect_kwargs)
    kwargs.pop("timeout", None)  # `fab -t`: applied through connect_timeout instead
    kwargs.update(banner_timeout=timeout, auth_timeout=timeout)
    cxn.connect_kwargs = kwargs
    cxn.connect_timeout = timeout
    strict = str(cxn.ssh_config.get("stricthostkeychecking", "yes")).lower()
    files = _known_hosts_files(cxn.ssh_config)
    # Both kinds are trusted alike, as OpenSSH does; known_hosts is appended to by
    # _AcceptNew, never rewritten from this copy (paramiko's save_host_keys is not used).
    keys = cxn.client.get_host_keys()
    for f in files + _files(cxn.ssh_config, "globalknownhostsfile", "/etc/ssh/ssh_known_hosts"):
        parsed = _known_hosts(f)
        if parsed is not None:
            # Fresh entries around the shared, immutable key objects: a key this client
            # adds (accept-new) changes its own list only. (HostKeys.update() would look
            # every name up again, hashing each hashed one: quadratic.)
            keys._entries.extend(paramiko.hostkeys.HostKeyEntry(e.hostnames, e.key)
                                 for e in parsed._entries)
    if accept_new or strict in ("accept-new", "no", "off"):
        cxn.client.set_missing_host_key_policy(_AcceptNew(files[0]))
    else:
        cxn.client.set_missing_host_key_policy(_Reject())
    if hasattr(cxn.gateway, "client"):
        _prepare(cxn.gateway, timeout, accept_new)


def connect_timeout(cxn, timeout=None):
    """The timeout in force for cxn: the caller's, `fab -t`, ssh_config, Fabric's config, 10."""
    return float(timeout or cxn.connect_kwargs.get("timeout") or cxn.connect_timeout or DEFAULT_TIMEOUT)


def _describe(cxn):
    return f"{cxn.user}@{cxn.host}:{cxn.port}"


def _socket_errors(e):
    """The OSErrors behind paramiko's NoValidConnectionsError (one per address tried)."""
    return list(getattr(e, "errors", {}).values()) or [e]


def _seconds(t):
    return f"{t:g} s"


class SharedConfigConnection(Connection):
    """A fabric.Connection that never writes into its config.

    The config is the one every host's thread shares, and Fabric's Connection.__init__
    wrote into it twice: it assigns `inline_ssh_env`, no attribute of its class, and
    resolve_connect_kwargs adds `key_filename` to the config's own connect_kwargs when the
    caller gives none. Every write re-merges the config from nothing, and another host's
    thread then read it half-built ("No attribute or config key found for 'user'", in ~1 of
    80 deploys to 8 or 16 hosts); the key files of one host's IdentityFile also piled up in
    the next host's list. Here `inline_ssh_env` is a class attribute and the connect
    arguments a new dict."""
    inline_ssh_env = None

    def resolve_connect_kwargs(self, connect_kwargs):
        """Fabric's result (key files: the config's, the caller's, then ssh_config's
        IdentityFile), as a new dict."""
        config_kwargs = self.config.connect_kwargs
        kwargs = dict(connect_kwargs or config_kwargs)
        keys = []
        for value in (config_kwargs.get("key_filename", []),
                      (connect_kwargs or {}).get("key_filename", []),
                      self.ssh_config.get("identityfile", [])):
            keys += [value] if isinstance(value, str) else list(value)
        if keys:
            kwargs["key_filename"] = keys
        return kwargs


def exec_channel(cxn, argv):
    """A new session on the open connection `cxn` running `argv` (quoted here): a second
    command beside the agent costs no new login. Paramiko's Channel; its errors as raised."""
    import shlex
    chan = cxn.client.get_transport().open_session()
    chan.exec_command(shlex.join(argv))
    return chan


def server_key(cxn):
    """(type, base64) of the host key the open connection `cxn` checked on connecting."""
    key = cxn.client.get_transport().get_remote_server_key()
    return key.get_name(), key.get_base64()


def connection(name, config):
    """A Connection to `name`, not opened yet, that leaves `config` as it was."""
    return SharedConfigConnection(name, config=config)


def open_connection(name, config, *, timeout=None, accept_new=False):
    """An open, host-key-checked fabric.Connection to `name`, or HostUnreachable."""
    cxn = connection(name, config)
    timeout = connect_timeout(cxn, timeout)
    _prepare(cxn, timeout, accept_new)

    def attempt():
        t0 = time.monotonic()
        try:
            cxn.open()
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            cxn.client.close()
            errs = _socket_errors(e)
            text = "; ".join(sorted({error_words(x) for x in errs}))
            if any(getattr(x, "errno", None) in TRANSIENT_ERRNOS for x in errs):
                raise _Transient(text) from e
            raise HostUnreachable(f"cannot connect to {_describe(cxn)}: {text}") from None
        except (ConnectionResetError, ConnectionRefusedError, EOFError) as e:
            cxn.client.close()
            raise _Transient(error_words(e)) from e
        except paramiko.SSHException as e:
            # A handshake that failed fast is sshd dropping us (MaxStartups, restart):
            # retry. One that took the whole timeout is a host that never answered.
            cxn.client.close()
            if isinstance(e, (UnknownHostKey, paramiko.BadHostKeyException,
                              paramiko.AuthenticationException)):
                raise
            if time.monotonic() - t0 >= 0.9 * timeout:
                raise socket.timeout() from e
            raise _Transient(error_words(e)) from e

    def retried():
        """The retry policy (tenacity), imported once a first attempt was refused: most
        connections never need it, and every task would pay for its import otherwise."""
        from tenacity import (Retrying, retry_if_exception_type, stop_after_attempt,
                              stop_after_delay, wait_fixed, wait_random)
        wait = wait_fixed(0.5) + wait_random(0, 0.5)
        time.sleep(wait(None))  # the wait before the second attempt, as tenacity would
        for retry in Retrying(retry=retry_if_exception_type(_Transient), reraise=True, wait=wait,
                              stop=stop_after_delay(RETRY_BUDGET_S - (time.monotonic() - started))
                              | stop_after_attempt(3)):
            with retry:
                attempt()

    started = time.monotonic()
    try:
        try:
            attempt()
        except _Transient:
            retried()
    except HostUnreachable:
        raise
    except _Transient as e:
        raise HostUnreachable(f"cannot connect to {_describe(cxn)}: {e} "
                              f"(retried for up to {RETRY_BUDGET_S} s)") from None
    except UnknownHostKey as e:
        known = _known_hosts_files(cxn.ssh_config)
        host, _, port = e.hostname.strip("[").partition("]:")
        raise HostUnreachable(
            f"unknown host key for {e.hostname} (not in {', '.join(known)}): nothing was run there",
            details=[f"its key: {e.key.get_name()} {e.key.fingerprint}",
                     f"verify it, then trust it: ssh-keyscan{' -p ' + port if port else ''} {host} >> {known[0]}",
                     "or pass --accept-new-host-keys, or set `StrictHostKeyChecking accept-new` "
                     "for this host in your ssh config"]) from None
    except paramiko.BadHostKeyException as e:
        name = known_hosts_name(e.hostname, cxn.port)
        files = [f for f in _known_hosts_files(cxn.ssh_config)
                 + _files(cxn.ssh_config, "globalknownhostsfile", "/etc/ssh/ssh_known_hosts")
                 if (_known_hosts(f) or {}).get(name) is not None] or _known_hosts_files(cxn.ssh_config)[:1]
        import shlex
        remove = " and ".join(f"`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(f)}`" for f in files)
        raise HostUnreachable(
            f"host key of {name} does NOT match {', '.join(files)}: possible man-in-the-middle; "
            f"nothing was run there. If the host was reinstalled, remove its old key with {remove}") from None
    except paramiko.AuthenticationException as e:
        raise HostUnreachable(f"authentication to {_describe(cxn)} failed: {e}; check User/IdentityFile "
                              "in your ssh config, or pass -i KEY") from None
    except (socket.timeout, TimeoutError):
        raise HostUnreachable(f"{_describe(cxn)} did not answer within {_seconds(timeout)} (connect timeout)",
                              details=["a longer wait: fab -t N, or ConnectTimeout in your ssh config"]) from None
    except (paramiko.SSHException, OSError) as e:
        raise HostUnreachable(f"cannot connect to {_describe(cxn)}: {error_words(e)}") from None
    return cxn
