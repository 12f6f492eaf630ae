"""tasks/sshconnect.py without a network: what building a connection does to the config."""
from fabric import Config

from tasks import sshconnect


def test_a_connection_leaves_the_config_every_host_thread_shares_untouched():
    # Fabric's Connection.__init__ assigns inline_ssh_env, no attribute of its class: the
    # assignment wrote into the shared config, and each write rebuilt it from nothing while
    # other hosts' threads read it (an 8-host deploy failed once with "No attribute or config
    # key found for 'user'").
    config = Config(overrides={"inline_ssh_env": True})
    merges = []
    real_merge = config.merge
    config.merge = lambda: merges.append(1) or real_merge()
    cxn = sshconnect.connection("root@h1:2222", config)
    assert merges == [] and config._modifications == {}
    assert (cxn.user, cxn.host, cxn.port, cxn.inline_ssh_env) == ("root", "h1", 2222, True)
