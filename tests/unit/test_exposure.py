"""The `exposure` preflight check: what a server listening openly leaves to anyone (no host)."""


def test_the_exposure_warning_says_what_an_api_key_leaves_open(tmp_path, monkeypatch):
    """Pure (no host): the profile alone decides. vLLM 0.32's key middleware guards only paths
    under /v1, /v2, /inference and /cohere (checked against the real engine: /metrics, /health,
    /version, /tokenize and POST /invocations answered without the key; /v1/* said 401)."""
    from tasks.steps.preflight import exposure_checks
    from tasks.profile import load_profile

    def warn(engine, host, key):
        lines = ["[target]", 'hosts = ["h1"]', "[server]", f'engine = "{engine}"', 'model = "/m"',
                 f'host = "{host}"', "port = 8000", "[server.env]"]
        lines += ['VLLM_API_KEY = { from_env = "LAB_KEY" }'] if key else []
        path = tmp_path / f"{engine}-{host}-{key}.toml"
        path.write_text("\n".join(lines) + "\n")
        return [c["message"] for c in exposure_checks(load_profile(path))]
    monkeypatch.setenv("LAB_KEY", "k")
    (keyed,) = warn("vllm", "0.0.0.0", True)
    assert keyed.startswith("the server listens on 0.0.0.0:8000, and vLLM's API key guards only "
                            "paths under /v1, /v2, /inference, /cohere: /metrics, /health, /version, "
                            "/tokenize and /invocations (which generates")
    assert 'bind [server] host = "127.0.0.1"' in keyed and "ssh -L 8000:127.0.0.1:8000 HOST" in keyed
    (open_,) = warn("vllm", "0.0.0.0", False)
    assert "with no API key: anyone who can reach port 8000 can use it" in open_
    assert warn("vllm", "127.0.0.1", True) == [] and warn("vllm", "127.0.0.1", False) == []
    assert warn("sglang", "0.0.0.0", True) == []  # SGLang's middleware: not checked here


def test_a_command_server_listening_openly_without_a_key_is_warned_too(tmp_path):
    """The docs promise the WARN for every server: a `command` one listens where its own
    --host/--bind says."""
    from tasks.steps.preflight import exposure_checks
    from tasks.profile import load_profile

    def warn(host, command, args=()):
        path = tmp_path / "cmd.toml"
        path.write_text("\n".join(["[target]", 'hosts = ["h1"]', "[server]", 'engine = "command"',
                                   f"command = {command!r}".replace("'", '"'), f'host = "{host}"',
                                   "port = 8000", "[server.args]", *args]) + "\n")
        return [c["message"] for c in exposure_checks(load_profile(path))]
    # [server] host is where llmfab reaches it, not passed to a command: its argv says where
    assert warn("0.0.0.0", ["python3", "server.py"]) == []
    (bound,) = warn("127.0.0.1", ["python3", "-m", "http.server", "--bind", "0.0.0.0", "8000"])
    assert "listens on 0.0.0.0:8000 with no API key" in bound and "VLLM_API_KEY" not in bound
    assert "give the command a key of its own" in bound
    assert len(warn("127.0.0.1", ["gunicorn", "-b", "0.0.0.0:8000", "app:app"])) == 1
    assert warn("127.0.0.1", ["uvicorn", "app:app", "--host=127.0.0.1"]) == []
    # [server.args] are the command's flags too (configs/demo.toml: host = "127.0.0.1")
    assert len(warn("127.0.0.1", ["python3", "demo_server.py"], ['host = "0.0.0.0"', "port = 8000"])) == 1
    assert warn("127.0.0.1", ["python3", "demo_server.py"], ['host = "127.0.0.1"']) == []
