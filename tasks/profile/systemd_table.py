"""The profile's `[systemd]` table: how a `runtime = "systemd"` server is put under the host's systemd.

    [server]
    runtime = "systemd"
    [systemd]
    enable = true        # started again at boot (docs/runtimes.md)

The table is refused unless [server] runtime is "systemd": a key that would do nothing is an
error (exit 2) rather than a surprise after the next reboot.
"""
from dataclasses import dataclass

from .keys import Key, table

SYSTEMD_KEYS = table(
    "systemd",
    Key("enable", "boolean", "false",
        "enable the deployment's unit (`systemctl enable`): the host's systemd starts the "
        "current release again at boot; false: it runs until stopped or the host reboots"),
)


@dataclass(frozen=True)
class SystemdCfg:
    enable: bool = False


def read_systemd(ck, data, runtime):
    """The [systemd] table of the merged tree (defaults when absent)."""
    if "systemd" not in data:
        return SystemdCfg()
    t, p = data["systemd"], ("systemd",)
    if runtime != "systemd":
        ck.fail(p, '[systemd] only with [server] runtime = "systemd" (it is "%s")' % runtime, t)
    ck.table(t, p, SYSTEMD_KEYS)
    def boolean(c, v, q):
        if not isinstance(v, bool):
            c.fail(q, "true or false", v)
        return v
    return SystemdCfg(enable=ck.get(t, p, "enable", boolean, False))
