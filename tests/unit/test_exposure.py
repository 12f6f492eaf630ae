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
