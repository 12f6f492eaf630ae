"""`[weights]` in the profile (tasks/weights/sources.py): which keys it takes, and what a
pulled model changes at launch (HF_HUB_OFFLINE=1) and in the preflight (the fix `fab pull`)."""

import pytest

from tasks.errors import ProfileError
from tasks.hostside.preflight import check_paths
from tasks.profile import load_profile
from tasks.steps.launcher import render_launcher
from tasks.steps.preflight import preflight_request

BASE = ["[target]", 'name = "p"', "[server]", 'engine = "vllm"', 'model = "/m/target"']


def profile(tmp_path, *lines):
    path = tmp_path / "p.toml"
    path.write_text("\n".join(BASE + list(lines)) + "\n")
    return load_profile(path)


def env_of(p):
    text = render_launcher(p)
    start = text.index("\nENV = ")
    return text[start:text.index("\n\n", start)]


def test_a_pulled_model_launches_offline_unless_the_profile_says_otherwise(tmp_path):
    assert "HF_HUB_OFFLINE" not in env_of(profile(tmp_path))
    pulled = profile(tmp_path, "[weights]", '"/m/target" = "local:/data/target"')
    assert "'HF_HUB_OFFLINE': '1'" in env_of(pulled)
    own = profile(tmp_path, "[server.env]", 'HF_HUB_OFFLINE = "0"',
                  "[weights]", '"/m/target" = "local:/data/target"')
    assert "'HF_HUB_OFFLINE': '0'" in env_of(own)


def test_a_drafter_from_the_hub_keeps_the_hub_reachable(tmp_path):
    p = profile(tmp_path, "[server.args]", 'speculative-config = { method = "eagle3", model = "org/drafter", '
                          "num_speculative_tokens = 2 }",
                "[weights]", '"/m/target" = "local:/data/target"')
    assert "HF_HUB_OFFLINE" not in env_of(p)


def test_a_weights_key_the_profile_does_not_name_is_bad_input(tmp_path):
    with pytest.raises(ProfileError) as e:
        profile(tmp_path, "[weights]", '"/m/typo" = "local:/data/target"')
    assert "weights" in e.value.message and "/m/target" in e.value.message


def test_a_missing_pulled_path_is_a_fail_whose_fix_is_fab_pull(tmp_path):
    p = profile(tmp_path, "[weights]", f'"/m/target" = "local:{tmp_path}"')
    req = preflight_request(p)
    assert req["pulled"] == {"/m/target": f"local:{tmp_path}"}
    rec, = check_paths(req["paths"], req["pulled"])
    assert rec["status"] == "FAIL" and "fix: `fab pull`" in rec["message"]
    rec, = check_paths(req["paths"])
    assert rec["status"] == "FAIL" and "fab pull" not in rec["message"]
    rec, = check_paths([("server.model", str(tmp_path))], req["pulled"])
    assert rec["status"] == "OK"


def test_hub_sources_parse_to_repo_and_revision(tmp_path):
    p = profile(tmp_path, "[server.args]", 'speculative-config = { method = "eagle3", model = "/m/draft", '
                          "num_speculative_tokens = 2 }",
                "[weights]", '"/m/target" = "hf://Qwen/Qwen3.6-27B"', '"/m/draft" = "hf://org/drafter.v2@v1.0"')
    t, d = p.weights
    assert (t.repo, t.revision, t.local, t.hub) == ("Qwen/Qwen3.6-27B", "main", None, True)
    assert (d.repo, d.revision) == ("org/drafter.v2", "v1.0")
    assert "'HF_HUB_OFFLINE': '1'" in env_of(p)  # hub-pulled paths launch offline too


@pytest.mark.parametrize("source", [
    "hf://Qwen3", "hf://org/", "hf:///name", "hf://org/name/extra", "hf://org/name@", "hf://-org/name",
    "hf://org/na--me", "hf://org/name@a..b", "hf:/org/name", "Qwen/Qwen3", "local:relative/dir",
    "hf://org/" + "n" * 96])
def test_a_malformed_source_is_bad_input_naming_the_key(tmp_path, source):
    with pytest.raises(ProfileError) as e:
        profile(tmp_path, "[weights]", f'"/m/target" = "{source}"')
    assert 'weights."/m/target"' in e.value.message and "hf://ORG/NAME" in e.value.message
    assert e.value.code == 2


def test_the_hub_token_is_a_from_env_secret_never_a_literal(tmp_path, monkeypatch):
    with pytest.raises(ProfileError) as e:
        profile(tmp_path, "[weights]", '"/m/target" = "hf://org/name"', 'HF_TOKEN = "hf_literal_token"')
    assert "weights.HF_TOKEN" in e.value.message and "from_env" in e.value.message
    assert "hf_literal_token" not in e.value.message
    monkeypatch.setenv("MY_HUB_TOKEN", "hf_from_env")
    p = profile(tmp_path, "[weights]", '"/m/target" = "hf://org/name"', 'HF_TOKEN = { from_env = "MY_HUB_TOKEN" }')
    w, = p.weights
    assert w.token.value == "hf_from_env" and "hf_from_env" not in repr(p.weights)
    monkeypatch.delenv("MY_HUB_TOKEN")
    # Unset: kept unread at load (a task that pulls nothing does not need it); `fab pull` says
    # which key and variable (tests/lab/test_pull_hub.py).
    path = tmp_path / "p.toml"
    path.write_text("\n".join(BASE + ["[weights]", '"/m/target" = "hf://org/name"',
                                      'HF_TOKEN = { from_env = "MY_HUB_TOKEN" }']) + "\n")
    w, = load_profile(path, need_secrets=False).weights
    assert w.token.value is None and "weights.HF_TOKEN" in w.token.missing and "MY_HUB_TOKEN" in w.token.missing
