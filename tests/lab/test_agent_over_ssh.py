"""The host agent over real SSH: a banner from the shell's start-up file, and cold and warm starts each one connection."""
import shutil
import sys
from tasks.transport.agent import Host
from tasks.transport.agent_code import TASKS, Payload


def test_over_ssh_cold_and_warm_each_take_one_connection_and_one_remote_command(lab):
    """The `need` exchange rides the one command's stdin/stdout: still 1 + 1 (sshd's log)."""
    from fabric import Config
    sys.path.insert(0, str(TASKS.parent / "benchmarks"))
    from harness import count_sshd
    from hostlab import wait_for

    shutil.rmtree(lab.home("h1") / ".cache" / "llmfab", ignore_errors=True)
    for want in ("sent", "cached"):
        offset = len(lab.sshd_log("h1"))
        host = Host("h1", config=Config(runtime_ssh_path=str(lab.ssh_config)), python="/usr/bin/python3")
        try:
            hello = host.start()
            assert host.call("hello")["agent_dir"] == hello["agent_dir"]
        finally:
            host.close()
        assert hello["code"] == want
        assert hello["agent_dir"] == "/root/.cache/llmfab/agent/" + Payload().digest[:32]
        wait_for(lambda: not lab.session_sshd_pids("h1"), 20, "the session to close")
        counts = count_sshd(lab.sshd_log("h1")[offset:])
        assert (counts["connections"], counts["commands"]) == (1, 1), counts


def test_a_banner_printed_by_the_shell_start_up_file_does_not_stop_the_agent(lab):
    """sshd runs the agent's command through the user's shell; Debian's bash reads ~/.bashrc
    for it, and a .bashrc that greets on stdout writes before the agent does. Those lines are
    skipped, and the agent works as on any host."""
    from fabric import Config
    bashrc = lab.home("h2") / ".bashrc"
    before = bashrc.read_text() if bashrc.exists() else None
    bashrc.write_text("echo 'Welcome to h2 -- authorised use only'\necho '{not json'\n" + (before or ""))
    host = Host("h2", config=Config(runtime_ssh_path=str(lab.ssh_config)), python="/usr/bin/python3")
    try:
        hello = host.start()
        assert hello["hostname"] == "h2" and host.call("hello")["pid"] == hello["pid"]
    finally:
        host.close()
        if before is None:
            bashrc.unlink()
        else:
            bashrc.write_text(before)
