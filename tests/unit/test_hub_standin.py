"""The hub stand-in (tests/standins/hub.py) against what the hub is recorded to answer, and
read through the real huggingface_hub client: what `fab pull` relies on for hf:// sources
(the commit, each file's size and LFS sha256, the headers of a resolve, Range, refusals).

Recorded: tests/fixtures/hub/recorded.json (from huggingface_hub's own docs and tests)."""
import hashlib
import json
import os
import urllib.request
from pathlib import Path

import pytest

from standins.hub import HubStandIn, git_blob_id, lfs_pointer

import huggingface_hub
from huggingface_hub import errors as hub_errors

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "hub" / "recorded.json").read_text())
CONFIG = b'{"model_type": "qwen3"' + b" " * 827 + b"}\n"   # 851 bytes, as the recorded config.json


@pytest.fixture(scope="module")
def hub():
    with HubStandIn() as h:
        h.weights = os.urandom(1 << 20)
        h.commit = h.add("org/model", {"config.json": CONFIG, "model.safetensors": h.weights})
        h.add("org/private", {"config.json": b"{}"}, token="hf_secret_token")
        h.add("org/gated", {"config.json": b"{}"}, token="hf_gated_token", gated=True)
        yield h


def api(hub, token=None):
    return huggingface_hub.HfApi(endpoint=hub.endpoint, token=token)


def test_an_lfs_files_blob_id_and_pointer_size_follow_the_recorded_hub():
    # The hub lists an LFS file with the git blob id of its pointer text and that text's size.
    for f in RECORDED["tree"]["files"]:
        if f["lfs"]:
            pointer = lfs_pointer(f["lfs"]["sha256"], f["lfs"]["size"])
            assert len(pointer) == f["lfs"]["pointer_size"], f["path"]
            assert git_blob_id(pointer) == f["blob_id"], f["path"]
            assert f["size"] == f["lfs"]["size"]  # the real size, not the pointer's


def test_model_info_with_files_metadata_has_the_hubs_shape(hub):
    raw = json.loads(urllib.request.urlopen(
        f"{hub.endpoint}/api/models/org/model/revision/main?blobs=true").read())
    assert raw["sha"] == hub.commit and raw["id"] == "org/model"
    recorded_keys = {"path": "rfilename", "size": "size", "blob_id": "blobId", "lfs": "lfs"}
    by_name = {s["rfilename"]: s for s in raw["siblings"]}
    for f in RECORDED["tree"]["files"][:3]:  # a small file and an LFS one, as recorded
        want = {recorded_keys[k] for k, v in f.items() if v is not None}
        got = by_name["model.safetensors" if f["lfs"] else "config.json"]
        assert set(got) == want
        if f["lfs"]:
            assert set(got["lfs"]) == {"size", "sha256", "pointerSize"}  # the JSON names of pointer_size
    plain = json.loads(urllib.request.urlopen(f"{hub.endpoint}/api/models/org/model/revision/main").read())
    assert all(set(s) == {"rfilename"} for s in plain["siblings"])  # no blobs=true: names only

    info = api(hub).model_info("org/model", revision="main", files_metadata=True)
    sib = {s.rfilename: s for s in info.siblings}
    assert info.sha == hub.commit
    assert sib["model.safetensors"].lfs.sha256 == hashlib.sha256(hub.weights).hexdigest()
    assert sib["model.safetensors"].size == len(hub.weights)
    assert sib["config.json"].lfs is None and sib["config.json"].blob_id == git_blob_id(CONFIG)


def test_resolve_headers_are_what_the_client_reads(hub):
    rec = RECORDED["head_small_file"]
    url = huggingface_hub.hf_hub_url("org/model", "config.json", revision=hub.commit, endpoint=hub.endpoint)
    meta = huggingface_hub.get_hf_file_metadata(url)
    assert meta.commit_hash == hub.commit and meta.etag == git_blob_id(CONFIG)
    assert (meta.location != url) is rec["redirect"] and meta.size == rec["size"] == len(CONFIG)

    url = huggingface_hub.hf_hub_url("org/model", "model.safetensors", revision="main", endpoint=hub.endpoint)
    meta = huggingface_hub.get_hf_file_metadata(url)
    assert meta.commit_hash == hub.commit  # a branch name resolves to its commit
    assert meta.location.startswith(hub.cdn_url)  # redirected to another host, as recorded
    assert meta.size == len(hub.weights)  # the LFS file's size, not the pointer's
    assert meta.etag == hashlib.sha256(hub.weights).hexdigest()  # X-Linked-Etag: the sha256

    req = urllib.request.Request(meta.location, headers={"Range": "bytes=100-"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 206 and r.headers["Content-Range"] == f"bytes 100-{len(hub.weights) - 1}/{len(hub.weights)}"
        assert r.read() == hub.weights[100:]


def test_the_real_client_downloads_and_the_token_stays_on_the_hub(hub, tmp_path):
    got = huggingface_hub.hf_hub_download("org/private", "config.json", revision="main", endpoint=hub.endpoint,
                                          cache_dir=tmp_path, token="hf_secret_token")
    assert Path(got).read_bytes() == b"{}"
    path = huggingface_hub.hf_hub_download("org/model", "model.safetensors", revision=hub.commit,
                                           endpoint=hub.endpoint, cache_dir=tmp_path, token="hf_secret_token")
    assert Path(path).read_bytes() == hub.weights
    assert "Bearer hf_secret_token" in hub.auth_seen("hub")
    assert hub.auth_seen("cdn") == []  # the client sends no token to the CDN


@pytest.mark.parametrize("repo, rev, token, error", [
    ("org/model", "no-such-branch", None, hub_errors.RevisionNotFoundError),
    ("org/nothing", "main", None, hub_errors.RepositoryNotFoundError),
    ("org/private", "main", None, hub_errors.RepositoryNotFoundError),  # private: the hub says 401 not found
    ("org/gated", "main", None, hub_errors.GatedRepoError),
    ("org/model", "main", "hf_wrong", hub_errors.HfHubHTTPError),
])
def test_refusals_map_to_the_clients_errors(hub, repo, rev, token, error):
    with pytest.raises(error) as e:
        api(hub, token).model_info(repo, revision=rev, files_metadata=True)
    if error is hub_errors.HfHubHTTPError:
        assert e.value.response.status_code == 401 and not isinstance(e.value, hub_errors.RepositoryNotFoundError)
