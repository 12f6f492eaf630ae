"""An endpoint's member slots (tasks/endpoint/profile.py, router.py): the swap port, its
errors, and the router configuration holding both slots, checked by the real HAProxy."""
import json
import shutil
import subprocess

import pytest

from tasks.endpoint.profile import load_endpoint, members_for_router
from tasks.endpoint.router import haproxy_cfg, write_router_dir
from tasks.errors import ProfileError


def member(tmp_path, name, port):
    p = tmp_path / f"{name}.toml"
    p.write_text("\n".join(["[target]", f'name = "{name}"', "[server]", 'engine = "vllm"',
                            f'model = "/models/{name}"', f"port = {port}",
                            "[server.args]", f'served-model-name = "{name}-model"', ""]))
    return p


def endpoint(tmp_path, members, *extra):
    p = tmp_path / "ep.toml"
    p.write_text("\n".join(["[endpoint]", "port = 8000", f"members = {json.dumps([str(m) for m in members])}",
                            *extra, ""]))
    return p


def test_each_member_has_a_second_slot_on_its_swap_port(tmp_path):
    ep = load_endpoint(endpoint(tmp_path, [member(tmp_path, "chat", 8101), member(tmp_path, "coder", 8102)],
                                "[endpoint.swap_port]", "coder = 9999"))
    chat, coder = ep.members
    assert (chat.swap_port, coder.swap_port) == (9101, 9999)
    assert (chat.slot_name("a"), chat.slot_name("b")) == ("chat", "chat-b")
    assert (coder.slot_port("a"), coder.slot_port("b")) == (8102, 9999)
    cfg = haproxy_cfg(members_for_router(ep), "127.0.0.1", 8000, 8001)
    assert "backend be_chat\n  server a 127.0.0.1:8101\n  server b 127.0.0.1:9101 disabled\n" in cfg


def test_a_swap_port_that_collides_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ProfileError) as e:
        load_endpoint(endpoint(tmp_path, [member(tmp_path, "chat", 8101), member(tmp_path, "coder", 8102)],
                               "[endpoint.swap_port]", "chat = 8102"))
    assert "endpoint.swap_port.chat" in e.value.message and "8102" in e.value.message
    with pytest.raises(ProfileError) as e:
        load_endpoint(endpoint(tmp_path, [member(tmp_path, "chat", 8101)], "[endpoint.swap_port]", "nobody = 9000"))
    assert "endpoint.swap_port.nobody" in e.value.message


def test_the_real_haproxy_accepts_the_configuration_and_the_parking_hook(tmp_path):
    """`haproxy -c` parses haproxy.cfg and loads llmfab_park.lua (a Lua syntax error fails here)."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    ep = load_endpoint(endpoint(tmp_path, [member(tmp_path, "chat", 8101), member(tmp_path, "coder", 8102)]))
    d = write_router_dir(tmp_path / "router", members_for_router(ep), "127.0.0.1", 8000, 8001)
    r = subprocess.run([haproxy, "-c", "-f", "haproxy.cfg"], cwd=d, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_router_that_does_not_answer_a_switch_is_said_in_words(tmp_path):
    from tasks.endpoint.swap import _why
    ep = load_endpoint(endpoint(tmp_path, [member(tmp_path, "chat", 8101)]))
    words = _why({"status": None, "error": "Connection refused"}, ep)
    assert "admin port 8001 does not answer (Connection refused)" in words and "fab status" in words
    assert _why({"status": 502, "body": {"ok": False, "error": "slot b does not answer (503)"}}, ep) \
        == "answered 502: slot b does not answer (503)"
