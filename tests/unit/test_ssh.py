"""tasks/transport/ssh.py without a network: what building a connection does to the config."""
import paramiko
from fabric import Config

from tasks.transport import ssh


def test_connections_leave_the_config_every_host_thread_shares_untouched(tmp_path):
    # Fabric's Connection.__init__ wrote into the config it was given (inline_ssh_env, no
    # attribute of its class; key_filename into the config's own connect_kwargs), and each
    # write rebuilt the config from nothing while other hosts' threads read it: an 8- and a
    # 16-host deploy failed with "No attribute or config key found for 'user'".
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host h1\n  IdentityFile /keys/h1\nHost h2\n  IdentityFile /keys/h2\n")
    config = Config(overrides={"inline_ssh_env": True, "connect_kwargs": {"key_filename": ["/keys/all"]}},
                    ssh_config=paramiko.SSHConfig.from_path(str(ssh_config)))
    merges = []
    real_merge = config.merge
    config.merge = lambda: merges.append(1) or real_merge()
    one = ssh.connection("root@h1:2222", config)
    two = ssh.connection("h2", config)
    assert merges == [] and config._modifications == {}
    assert (one.user, one.host, one.port, one.inline_ssh_env) == ("root", "h1", 2222, True)
    # Each host's keys: the config's, then its own IdentityFile (none of another host's).
    assert one.connect_kwargs["key_filename"] == ["/keys/all", "/keys/h1"]
    assert two.connect_kwargs["key_filename"] == ["/keys/all", "/keys/h2"]
    assert list(config.connect_kwargs["key_filename"]) == ["/keys/all"]
