"""The host side of `fab pull` on files the source lacks (tasks/weights/host/receiver.py), on
real files: an earlier pull's files go, a user's stay, llmfab's own names never count."""
import hashlib
import json

from tasks.weights.host import receiver


def _files(root, names):
    out = []
    for name, data in names.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        out.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return out


def _manifest(root, files):
    return receiver.op_weights_manifest(**{"path": str(root), "source": "local:/src", "files": files})


def test_an_earlier_pulls_file_goes_a_users_and_a_replaced_one_stay(tmp_path):
    old = _files(tmp_path, {"a.safetensors": b"a", "b.safetensors": b"b", "sub/c.bin": b"c",
                            "d.json": b"d"})
    assert _manifest(tmp_path, old) == {"ok": True, "removed": [], "extra": []}
    (tmp_path / "d.json").write_bytes(b"the user's own now")         # replaced under its name
    (tmp_path / "NOTES.md").write_text("mine")
    (tmp_path / ".b.safetensors.llmfab-part").write_bytes(b"half")    # llmfab's, of a gone name
    (tmp_path / ".a.safetensors.llmfab-part").write_bytes(b"half")    # llmfab's, of a kept name
    (tmp_path / (receiver.STAMPS + ".123.tmp")).write_text("{}")
    new = [f for f in old if f["path"] == "a.safetensors"]
    stamps = receiver._stamps(str(tmp_path))
    assert receiver.leftovers(str(tmp_path), {"a.safetensors"}, stamps) == (
        ["b.safetensors", "sub/c.bin"], ["NOTES.md", "d.json"])
    got = _manifest(tmp_path, new)
    assert got == {"ok": True, "removed": ["b.safetensors", "sub/c.bin"], "extra": ["NOTES.md", "d.json"]}
    assert not (tmp_path / "b.safetensors").exists() and not (tmp_path / "sub").exists()
    assert not (tmp_path / ".b.safetensors.llmfab-part").exists()
    assert (tmp_path / ".a.safetensors.llmfab-part").exists()
    assert (tmp_path / "d.json").read_bytes() == b"the user's own now" and (tmp_path / "NOTES.md").exists()
    assert json.loads((tmp_path / ".llmfab-manifest.json").read_text())["files"] == new
    # The next pull of the same source: nothing more goes, the user's files are still named.
    assert _manifest(tmp_path, new) == {"ok": True, "removed": [], "extra": ["NOTES.md", "d.json"]}


def test_a_manifest_not_written_by_llmfab_claims_nothing(tmp_path):
    files = _files(tmp_path, {"a.safetensors": b"a", "b.safetensors": b"b"})
    (tmp_path / "manifest.json").write_text(json.dumps({"files": files}))
    assert receiver.leftovers(str(tmp_path), {"a.safetensors"}, {}) == ([], ["b.safetensors", "manifest.json"])


def test_a_models_own_manifest_json_is_a_file_like_any_other_and_an_old_record_goes(tmp_path):
    # A model that ships its own manifest.json: a source file, never llmfab's record.
    files = _files(tmp_path, {"a.safetensors": b"a", "manifest.json": b'{"its": "own"}'})
    assert _manifest(tmp_path, files) == {"ok": True, "removed": [], "extra": []}
    assert (tmp_path / "manifest.json").read_bytes() == b'{"its": "own"}'
    assert json.loads((tmp_path / ".llmfab-manifest.json").read_text())["files"] == files
    # A directory an earlier llmfab pulled (its record was manifest.json): the record is read
    # (its files still count as the pull's) and removed once replaced.
    old = tmp_path / "old"
    old.mkdir()
    files = _files(old, {"a.safetensors": b"a", "b.safetensors": b"b"})
    (old / "manifest.json").write_text(json.dumps({"files": files, "pulled_by": "llmfab"}))
    got = _manifest(old, files[:1])
    assert got == {"ok": True, "removed": ["b.safetensors", "manifest.json"], "extra": []}
    assert sorted(p.name for p in old.iterdir()) == [".llmfab-manifest.json", ".llmfab-verified.json",
                                                     "a.safetensors"]


def test_a_nested_destination_is_never_the_outer_ones_leftover(tmp_path):
    files = _files(tmp_path, {"config.json": b"m"})
    _files(tmp_path, {"drafter/config.json": b"d", "drafter/.llmfab-manifest.json": b"{}"})
    got = receiver.op_weights_manifest(**{"path": str(tmp_path), "source": "local:/src", "files": files,
                                        "inner": ["drafter"]})
    assert got == {"ok": True, "removed": [], "extra": []}
