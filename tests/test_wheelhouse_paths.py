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
