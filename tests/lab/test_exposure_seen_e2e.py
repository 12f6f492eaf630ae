"""Exposure judged from what really listens: a `command` server whose argv names no address
but which binds every address (`python -m http.server PORT` does) gets the `exposure` WARN
once it runs, from its own listening socket, in deploy and in status; status says it for
every engine (here the stand-in vLLM told `--host 0.0.0.0`), and a server bound to 127.0.0.1
gets none."""
import json

from helpers import fab, flat, write_profile, vllm_profile


def http_server(lab, name, port, *bind):
    return write_profile(lab, name, [
        "[target]", 'hosts = ["h2"]', f'name = "{name}"',
        "[server]", 'engine = "command"',
        'command = ["python3", "-m", "http.server", "%d"%s]' % (port, "".join(f', "{a}"' for a in bind)),
        'host = "127.0.0.1"', f"port = {port}",
        "[ready]", 'health_path = "/"', 'models_path = ""', "timeout = 60", "poll_interval = 0.2"])


def warns(text):
    return [line for line in flat(text).split("WARN exposure ")[1:]]


def test_a_command_that_binds_every_address_unasked_is_warned_from_its_socket(lab):
    prof = http_server(lab, "seen-open", 31863)
    try:
        check = fab(lab, "check", profile=prof)
        assert "exposure" not in check.stdout, check.stdout  # the profile's words say nothing
        r = fab(lab, "deploy", "--json", profile=prof)
        record = json.loads(r.stdout.splitlines()[0])
        [warning] = record["exposure"]
        assert warning["address"] in ("0.0.0.0", "::") and warning["port"] == 31863, warning
        shown = "[::]:31863" if warning["address"] == "::" else "0.0.0.0:31863"
        assert f"the server listens on {shown} (its own listening socket says so" in warning["message"]
        assert "with no API key" in warning["message"] and "--bind" in warning["message"]
        assert len(warns(r.stderr)) == 1 and shown in warns(r.stderr)[0], r.stderr
        st = fab(lab, "status", profile=prof)
        assert len(warns(st.stdout)) == 1 and shown in warns(st.stdout)[0], st.stdout
        sj = json.loads(fab(lab, "status", "--json", profile=prof).stdout.splitlines()[0])
        assert [(w["address"], w["port"]) for w in sj["exposure"]] == [(warning["address"], 31863)]
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)


def test_a_command_bound_to_loopback_is_not_warned(lab):
    prof = http_server(lab, "seen-closed", 31864, "--bind", "127.0.0.1")
    try:
        r = fab(lab, "deploy", "--json", profile=prof)
        assert json.loads(r.stdout.splitlines()[0])["exposure"] == []
        assert "exposure" not in r.stderr
        sj = json.loads(fab(lab, "status", "--json", profile=prof).stdout.splitlines()[0])
        assert sj["exposure"] == []
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)


def test_status_warns_for_a_vllm_listening_on_every_address(lab):
    prof = vllm_profile(lab, "seen-vllm", "h2", 31865)
    text = prof.read_text().replace('host = "127.0.0.1"', 'host = "0.0.0.0"')
    prof.write_text(text)
    try:
        r = fab(lab, "deploy", profile=prof)
        assert len(warns(r.stdout)) == 1, r.stdout  # the preflight's, from the profile: not twice
        st = fab(lab, "status", profile=prof)
        assert len(warns(st.stdout)) == 1 and "0.0.0.0:31865 (its own listening socket" in flat(st.stdout), st.stdout
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)
