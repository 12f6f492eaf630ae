"""`fab targets` (issue 17): the Prometheus file_sd document of every running deployment,
with the real `fab` and sshd and the stand-in vLLM (tests/standins) on four lab hosts.

h1 and h2 run the deployment (h2 rolled back to its first release), h3 ran it and was
stopped, h4 never had it, `unreachable` does not answer. Every address in the document is
then scraped from here like Prometheus would: /metrics must answer with the stand-in's
vLLM counters, and the generation counter must show the --smoke completion that host served.

Here: the rest; the tests that need no host are in tests/unit/test_targets_file.py."""
import json
import os
import urllib.request
from types import SimpleNamespace
import pytest
from prometheus_client.parser import text_string_to_metric_families
import helpers
from helpers import write_profile
from hostlab import HostLab


PORT = 18470


NAME = "tgt"


@pytest.fixture(scope="module")
def lab():
    from conftest import require_lab
    require_lab()
    with HostLab(4) as the_lab:
        yield the_lab


def profile(lab, model_name):
    lines = ["[target]", f'name = "{NAME}"', "[server]", 'engine = "vllm"',
             f'python = "{lab.ml_python}"', f'model = "{lab.model_dir("tgt-model")}"',
             'host = "0.0.0.0"', f"port = {PORT}", "[server.args]", f'served-model-name = "{model_name}"',
             "[server.env]", 'STANDIN_LOAD_SECONDS = "0.5"', "[ready]", "timeout = 60",
             "poll_interval = 0.2"]
    return write_profile(lab, f"tgt-{model_name}", lines)


def fab(lab, *args, profile, code=0):
    r = helpers.fab(lab, *args, profile=profile, code=code, timeout=300)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    return r


@pytest.fixture(scope="module")
def fleet(lab):
    first, second = profile(lab, "tgt-a"), profile(lab, "tgt-b")
    fab(lab, "deploy", "--smoke", "-H", "h1,h2,h3", profile=first)
    old = json.loads((lab.home("h2") / "llmfab" / NAME / "server.json").read_text())["release"]
    fab(lab, "deploy", "-H", "h2", profile=second)
    fab(lab, "rollback", "-H", "h2", profile=second)  # h2 runs the first release (tgt-a) again
    fab(lab, "stop", "--grace", "5", "-H", "h3", profile=first)
    return SimpleNamespace(profile=second, h2_release=old, hosts="h1,h2,h3,h4,unreachable")


def test_targets_lists_every_running_deployment_and_each_answers_metrics(lab, fleet):
    r = fab(lab, "targets", "-H", fleet.hosts, profile=fleet.profile, code=3)
    doc = json.loads(r.stdout)
    assert [e["labels"]["llmfab_host"] for e in doc] == ["h1", "h2"], r.stdout
    for e in doc:
        h = e["labels"]["llmfab_host"]
        release = json.loads((lab.home(h) / "llmfab" / NAME / "server.json").read_text())["release"]
        assert e == {"targets": [f"{lab.ip(h)}:{PORT}"],
                     "labels": {"llmfab_deployment": NAME, "llmfab_release": release,
                                "llmfab_engine": "vllm", "llmfab_model": "tgt-a", "llmfab_host": h}}
        with urllib.request.urlopen(f"http://{e['targets'][0]}/metrics", timeout=5) as m:
            families = {f.name: f for f in text_string_to_metric_families(m.read().decode())}
        gen = families["vllm:generation_tokens"]
        assert gen.type == "counter" and {s.labels["model_name"] for s in gen.samples} == {"tgt-a"}
        assert "vllm:num_requests_running" in families
    assert doc[1]["labels"]["llmfab_release"] == fleet.h2_release  # the release that runs now
    # h1 still runs the server that answered the --smoke completion: one token generated.
    with urllib.request.urlopen(f"http://{doc[0]['targets'][0]}/metrics", timeout=5) as m:
        gen = {f.name: f for f in text_string_to_metric_families(m.read().decode())}["vllm:generation_tokens"]
    assert [s.value for s in gen.samples if s.name.endswith("_total")] == [1.0]
    # Left out, and named on stderr (stdout is the document alone).
    assert "[h3] left out: not running" in r.stderr, r.stderr
    assert "[h4] left out: not deployed here" in r.stderr, r.stderr
    assert "[unreachable] left out: " in r.stderr, r.stderr


def test_out_replaces_the_file_in_one_rename(lab, fleet, tmp_path):
    out = tmp_path / "llmfab.json"
    out.write_text("[]\n")
    reader = open(out)  # a reader of the old file keeps the whole old document
    r = fab(lab, "targets", "--out", str(out), "-H", fleet.hosts, profile=fleet.profile, code=3)
    assert r.stdout == "" and f"wrote 2 target(s) of 5 host(s) to {out}" in r.stderr
    assert reader.read() == "[]\n"
    doc = json.loads(out.read_text())
    assert [e["labels"]["llmfab_host"] for e in doc] == ["h1", "h2"]
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llmfab.json"]  # no temporary left


def test_out_in_a_missing_directory_is_bad_input(lab, fleet, tmp_path):
    r = fab(lab, "targets", "--out", str(tmp_path / "no" / "x.json"), "-H", "h1",
            profile=fleet.profile, code=2)
    assert "does not exist" in r.stdout + r.stderr and "[h1]" not in r.stdout + r.stderr
