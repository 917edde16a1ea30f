"""Issue 49, item 2: the nightly folds tonight's results only onto records the last signed table
vouches for, and takes archives as plain files only. Each test is an attack on what the site
serves, run through the real `envbuild ci earlier` (the nightly's own step runs it)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from table_fixtures import combo, image, passed, rec, write_all

from envbuild.archive import pack, unpack
from envbuild.errors import InputError
from envbuild.record import Record, write_record
from envbuild.sign import write_keypair
from envbuild.table import publish

A = combo(verl="0.4.1", ev="0.8.4")
B = combo(verl="0.5.0", ev="0.8.5")


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def _file(name: str, data: bytes = b"{}") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize("bad", [
    _special("records/x/a.json", tarfile.SYMTYPE, "/root/.docker/config.json"),
    _special("records/x/a.json", tarfile.LNKTYPE, "/etc/passwd"),
    _special("records/x/dev", tarfile.CHRTYPE),
    _file("../outside.json"),
    _file("/abs.json"),
    _file("records/x/.hidden.json"),
])
def test_unpack_takes_plain_files_at_safe_paths_only_and_writes_nothing_else(tmp_path, bad):
    data = _tar([_file("records/ok/1.json"), bad])
    with pytest.raises(InputError, match="member="):
        unpack(data, tmp_path / "out", "site/results.tar.gz")
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert not (tmp_path / "outside.json").exists()


def test_pack_is_the_same_bytes_from_the_same_files(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d / "records" / "x").mkdir(parents=True)
        (tmp_path / d / "records" / "x" / "1.json").write_text("{}")
    os.utime(tmp_path / "b" / "records" / "x" / "1.json", (1, 1))
    names = ["records/x/1.json"]
    assert pack(tmp_path / "a", names) == pack(tmp_path / "b", names)
    assert unpack(pack(tmp_path / "a", names), tmp_path / "c", "x") == names


@pytest.fixture
def night1(tmp_path):
    """Night 1's site as the next runner downloads it (compat.json.dsse, results.tar.gz, history.tar.gz)."""
    priv, pub, _ = write_keypair(tmp_path / "keys")
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1),
                    rec(B, passed("env", "contract"), img=image(B), run=2)])
    publish(res, priv, tmp_path / "table", name="envbuild/verl")
    served = tmp_path / "served"
    served.mkdir()
    for f in ("compat.json.dsse", "results.tar.gz"):
        shutil.copy2(Path(os.path.realpath(tmp_path / "table")) / f, served / f)
    return {"priv": priv, "pub": pub, "served": served, "tmp": tmp_path}


def _earlier(run_cli, n, out, *more):
    return run_cli("ci", "earlier", "--table", n["served"], "--out", out, *more)


def test_the_last_tables_records_come_back_verified(night1, run_cli):
    out = night1["tmp"] / "tonight"
    p = _earlier(run_cli, night1, out, "--key", night1["priv"])
    assert p.returncode == 0, p.stderr
    assert "2 records" in p.stdout
    assert sorted(q.parent.name for q in (out / "records").glob("*/*.json")) == sorted([A["id"], B["id"]])


def test_a_swapped_results_archive_is_refused_and_nothing_is_folded(night1, run_cli):
    """Whoever can change what the site serves once must not get the CI key's signature on a
    record from the future (run id 2099…) or on an invented row the next night."""
    forged = night1["tmp"] / "forged"
    write_record(forged, Record(combo=A, stage="probe", status="ok", image=image(A, build=9),
                                probe={"gpu": {"status": "pass", "checks": []}},
                                run_id="20991231T000000-ffffff", created="2099-12-31T00:00:00Z"))
    names = [str(q.relative_to(forged)) for q in forged.rglob("*.json")]
    (night1["served"] / "results.tar.gz").write_bytes(pack(forged, names))
    out = night1["tmp"] / "tonight"
    p = _earlier(run_cli, night1, out, "--pubkey", night1["pub"])
    assert p.returncode == 2 and "sha256 differs" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not out.exists() or not list(out.rglob("*.json"))


def test_a_table_signed_by_another_key_stops_the_night(night1, run_cli):
    other, _, _ = write_keypair(night1["tmp"] / "other")
    p = _earlier(run_cli, night1, night1["tmp"] / "tonight", "--key", other)
    assert p.returncode == 2 and "not signed by key" in p.stderr, p.stderr


def test_history_keeps_only_plain_tables_signed_by_the_key(night1, run_cli):
    """history.tar.gz is nobody's signature: a symlink in it (to the registry login a runner
    wrote) stops the night; an entry signed by another key is dropped, a real one kept."""
    env = (night1["served"] / "compat.json.dsse").read_bytes()
    other_priv, _, _ = write_keypair(night1["tmp"] / "other")
    res2 = night1["tmp"] / "res2"
    write_all(res2, [rec(A, passed("env"), img=image(A), run=3)])
    publish(res2, other_priv, night1["tmp"] / "other-table")
    foreign = (Path(os.path.realpath(night1["tmp"] / "other-table")) / "compat.json.dsse").read_bytes()
    (night1["served"] / "history.tar.gz").write_bytes(_tar([
        _file("20261201T000000Z.compat.json.dsse", env), _file("20261202T000000Z.compat.json.dsse", foreign),
        _file("index.json", b"[]"), _file("evil.html", b"<script>")]))
    hist = night1["tmp"] / "hist"
    p = _earlier(run_cli, night1, night1["tmp"] / "tonight", "--key", night1["priv"], "--history", hist)
    assert p.returncode == 0, p.stderr
    assert sorted(q.name for q in hist.iterdir()) == ["20261201T000000Z.compat.json.dsse"]
    assert "1 dropped" in p.stdout
    (night1["served"] / "history.tar.gz").write_bytes(_tar([
        _special("20261203T000000Z.compat.json.dsse", tarfile.SYMTYPE, "/home/runner/.docker/config.json")]))
    shutil.rmtree(hist)
    p = _earlier(run_cli, night1, night1["tmp"] / "tonight2", "--key", night1["priv"], "--history", hist)
    assert p.returncode == 2 and "not a regular file" in p.stderr, p.stderr
    assert not hist.exists()


def test_nothing_published_yet_is_a_first_run(tmp_path, run_cli):
    _, pub, _ = write_keypair(tmp_path / "keys")
    (tmp_path / "served").mkdir()
    p = run_cli("ci", "earlier", "--table", tmp_path / "served", "--out", tmp_path / "r", "--pubkey", pub)
    assert p.returncode == 0 and "first run" in p.stdout, p.stderr
