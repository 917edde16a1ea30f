"""Trust IV: names and paths that come from outside (the index's file names, a wheelhouse's
manifest) never reach outside the folder they are written to or read from."""

from __future__ import annotations

import json

import pytest

from envbuild.errors import InputError
from envbuild.materialize import check_paths
from envbuild.wheelhouse import choose_file, safe_filename


def test_index_file_names_must_be_one_plain_base_name():
    assert safe_filename("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert safe_filename("pylatexenc-2.10.tar.gz")
    for bad in ("../../x-1.0.tar.gz", "a/b-1.0.tar.gz", ".hidden-1.0.tar.gz", "x-1.0..tar.gz", "", None, "x\n.whl"):
        assert not safe_filename(bad), bad
    sha = "a" * 64
    files = [{"filename": "../../evil-1.0.tar.gz", "hashes": {"sha256": sha}}]
    assert choose_file(files, "1.0", {sha}, {}) is None  # never a candidate: the row has no file
    files.append({"filename": "evil-1.0.tar.gz", "hashes": {"sha256": sha}})
    assert choose_file(files, "1.0", {sha}, {})["filename"] == "evil-1.0.tar.gz"


def test_a_manifest_may_not_point_outside_the_wheelhouse(tmp_path):
    (tmp_path / "files").mkdir()
    ok = {"locks": ["locks/r/torch.txt"], "files": [{"file": "files/a-1.0-py3-none-any.whl"}]}
    check_paths(tmp_path, ok)
    for bad in ({"locks": ["../outside.txt"], "files": []}, {"locks": ["/etc/passwd"], "files": []},
                {"locks": [], "files": [{"file": "files/../../x.whl"}]}, {"locks": [], "files": [{"file": 7}]}):
        with pytest.raises(InputError) as e:
            check_paths(tmp_path, bad)
        assert "outside the wheelhouse" in str(e.value) and "manifest.json" in str(e.value)
    link = tmp_path / "files" / "link.whl"
    link.symlink_to("/etc/hostname")
    with pytest.raises(InputError):
        check_paths(tmp_path, {"locks": [], "files": [{"file": "files/link.whl"}]})
    json.dumps(ok)


def _wheelhouse(tmp_path):
    """A row as `envbuild wheelhouse` writes it: its layers cut from one full lock whose sha256 is
    the row's lock_hash."""
    import hashlib

    from envbuild.lockfile import layer_text, parse_lock
    full_text = ("six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via -r requirements.in\n"
                 "torch==2.11.0 \\\n    --hash=sha256:" + "b" * 64 + "\n")
    full = parse_lock(full_text)
    (tmp_path / "locks" / "r").mkdir(parents=True)
    (tmp_path / "locks" / "r" / "full.txt").write_text(full_text)
    (tmp_path / "locks" / "r" / "torch.txt").write_text(layer_text(full, ["torch"], "# torch layer"))
    (tmp_path / "locks" / "r" / "verl.txt").write_text(layer_text(full, ["six"], "# verl layer"))
    return {"combo": {"id": "r"}, "lock_hash": hashlib.sha256(full_text.encode()).hexdigest(),
            "full_lock": "locks/r/full.txt", "locks": ["locks/r/torch.txt", "locks/r/verl.txt"], "files": []}


def test_the_wheelhouse_installs_only_the_lock_its_row_and_the_signed_table_name(tmp_path):
    """Issue 49: a wheel tampered together with the wheelhouse's lock copy and manifest installed,
    passed the environment check and was recorded under the row's real lock hash."""
    from envbuild.errors import TrustError
    from envbuild.materialize import check_lock

    row = _wheelhouse(tmp_path)
    assert check_lock(tmp_path, row) == "lock checked against its lock_hash"
    assert check_lock(tmp_path, row, row["lock_hash"]) == "lock checked against the signed table"
    # A layer's hash swapped for the tampered wheel's: not the lock the row names.
    layer = tmp_path / "locks" / "r" / "verl.txt"
    good = layer.read_text()
    layer.write_text(good.replace("a" * 64, "c" * 64))
    with pytest.raises(TrustError, match="six==1.17.0 is not pinned as the row's full lock pins it"):
        check_lock(tmp_path, row)
    # ... and the full lock and manifest changed with it: consistent, but not the signed table's lock.
    import hashlib
    full = tmp_path / "locks" / "r" / "full.txt"
    full.write_text(full.read_text().replace("a" * 64, "c" * 64))
    forged = {**row, "lock_hash": hashlib.sha256(full.read_bytes()).hexdigest()}
    assert check_lock(tmp_path, forged) == "lock checked against its lock_hash"
    with pytest.raises(TrustError, match="the signed table's is"):
        check_lock(tmp_path, forged, row["lock_hash"])
    # the manifest's lock_hash alone changed: the lock copy says otherwise
    layer.write_text(good)
    with pytest.raises(TrustError, match="is not the row's lock_hash"):
        check_lock(tmp_path, row)
    # a wheelhouse without its full lock cannot be checked against a signed table
    with pytest.raises(InputError, match="full_lock"):
        check_lock(tmp_path, {k: v for k, v in row.items() if k != "full_lock"}, row["lock_hash"])


def test_a_wheel_only_the_engines_own_index_serves_is_fetched_from_it(tmp_path, monkeypatch):
    """vocab.EngineSpec.extra_index (issue 51): the wheelhouse looks where the lock found the wheel
    (the engine's own index) when the configured one has no file with the lock's hash; a row of an
    engine without one stops with missing-wheel, as before."""
    import dataclasses

    from envbuild import wheelhouse
    from envbuild.errors import InfraError
    from envbuild.probe import vocab
    from envbuild.values import Combo

    sha = "c" * 64
    wheel = {"filename": "engwheel-1.0-py3-none-any.whl", "url": "https://engine.invalid/engwheel-1.0-py3-none-any.whl",
             "hashes": {"sha256": sha}, "size": 3}

    class Meta:
        def __init__(self, index=None):
            self.index = index

        def files(self, name):
            return [wheel] if self.index == "https://engine.invalid/simple" and name == "engwheel" else []

    monkeypatch.setattr(wheelhouse, "Metadata", Meta)
    monkeypatch.setattr(wheelhouse, "download", lambda f, path: 3)
    lock = f"engwheel==1.0 \\\n    --hash=sha256:{sha}\n"
    c = Combo("0.9.1", "vllm", "0.24.0", "2.11.0", "cu130", "3.12", glibc="2.28")
    with pytest.raises(InfraError, match="no file of engwheel==1.0"):
        wheelhouse.add_row(tmp_path / "a", {"schema": 1, "rows": {}}, c, {"engine": lock}, Meta(), {},
                           lock_hash="ab" * 32, era="2026-10-01")
    monkeypatch.setitem(vocab.ENGINE, "vllm", dataclasses.replace(vocab.ENGINE["vllm"],
                                                                  extra_index="https://engine.invalid/simple"))
    files, got, _ = wheelhouse.add_row(tmp_path / "b", {"schema": 1, "rows": {}}, c, {"engine": lock}, Meta(), {},
                                       lock_hash="ab" * 32, era="2026-10-01")
    assert [f["file"] for f in files] == ["files/engwheel-1.0-py3-none-any.whl"] and got == 3
