"""A row's environment without Docker (issue #29): `envbuild wheelhouse` fetches exactly the files of
a lock (hash-checked), `envbuild venv` installs them offline into a venv, reusing a node's own
distribution only where it is the lock's pin, and checks the result is the lock; `envbuild probe
--here` in that venv records the row in place, and publish folds it beside the row's image."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.fold import fold, fold_combo
from envbuild.index import Metadata
from envbuild.materialize import (MANIFEST, ROW_FILE, SCHEMA, Refused, host_matches, link_dist, materialize,
                                  plan_install)
from envbuild.pick import pick
from envbuild.query import Ask, answer, why_not
from envbuild.record import IN_PLACE, Record
from envbuild.selector import Selectors
from envbuild.table import build_table
from envbuild.values import Combo
from envbuild.wheelhouse import add_row, choose_file, pins_of


def test_a_node_distribution_stands_for_a_pin_only_as_that_release():
    assert host_matches("2.11.0", "2.11.0", "cu130")
    assert host_matches("2.11.0", "2.11.0+cu130", "cu130")  # the node's build of the row's own variant
    assert not host_matches("2.11.0", "2.11.0+cu128", "cu130")  # another variant's build
    assert not host_matches("2.11.0", "2.11.1", "cu130") and not host_matches("5.10.4", "5.17.0", "cu130")
    assert not host_matches("2.6.0+cu126", "2.6.0", "cu126") and not host_matches("1.0", None, "cu130")


def test_a_pin_neither_carried_nor_on_the_node_refuses_the_row(tmp_path):
    row = {"combo": {"id": "r"}, "files": [
        {"name": "torch", "version": "2.11.0", "file": "files/torch.whl", "host": True},
        {"name": "six", "version": "1.17.0", "file": "files/six.whl", "host": False}]}
    with pytest.raises(Refused, match=r"torch==2\.11\.0 \(the node has 2\.10\.0; not in the wheelhouse\)"):
        plan_install(row, tmp_path, {"torch": {"version": "2.10.0"}}, "cu130")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "six.whl").write_bytes(b"x")
    plan = plan_install(row, tmp_path, {"torch": {"version": "2.11.0+cu130"}}, "cu130")
    assert plan["reuse"] == [{"name": "torch", "version": "2.11.0+cu130", "pin": "2.11.0"}]
    assert [f["name"] for f in plan["install"]] == ["six"]


def test_a_reused_distribution_is_linked_file_by_file(tmp_path):
    base = tmp_path / "node-site"
    (base / "pkg").mkdir(parents=True)
    (base / "pkg" / "__init__.py").write_text("x = 1\n")
    (base / "pkg-1.0.dist-info").mkdir()
    (base / "pkg-1.0.dist-info" / "METADATA").write_text("Name: pkg\nVersion: 1.0\n")
    (base / "other").mkdir()  # another distribution of the node: must not become visible
    site = tmp_path / "venv-site"
    n = link_dist({"base": str(base), "files": ["pkg/__init__.py", "pkg-1.0.dist-info/METADATA",
                                                "../../../bin/pkg-tool"]}, site)
    assert n == 2 and (site / "pkg" / "__init__.py").is_symlink() and not (site / "other").exists()


def _in_place(c, probe, run, **place):
    r = rec(c, probe, run=run, status="fail" if any(v["status"] == "fail" for v in probe.values()) else "ok")
    r.image = None
    r.place = {"kind": IN_PLACE, "host": "h200", "gpu": ["NVIDIA H200"], "driver": "580.159.04",
               "cuda_runtime": "13.0", "reused": [{"name": "torch", "version": "2.11.0", "pin": "2.11.0"}], **place}
    return r


C = combo(verl="0.9.1", engine="hf", ev="", torch="2.11.0", cuda="cu130", python="3.12")


def test_in_place_verdicts_fold_beside_the_image_and_never_pin_an_image():
    image_rec = rec(C, passed("env", "contract"), img=image(C), run=1)
    row = fold_combo([image_rec, _in_place(C, passed("env", "contract", "gpu"), run=2)])
    assert (row.status, row.best_level, row.pinned) == ("verified", "contract", image(C)["digest"])
    assert row.in_place["status"] == "verified" and row.in_place["best_level"] == "gpu"
    assert row.in_place["host"]["gpu"] == ["NVIDIA H200"] and row.in_place["reused"][0]["name"] == "torch"
    assert row.level("gpu").status == "not-run"  # the image's gpu level: never run on the image
    table = build_table([row])
    assert pick(table, {"hf": True, "verl": "0.9.1"}, "gpu")[0] is None  # no image verified at gpu
    a = Ask(Selectors(verl="0.9.1", engine="hf"), level="gpu", in_place=True)
    assert answer(table, a).best.id == C["id"]
    assert pick(table, {"hf": True, "verl": "0.9.1"}, "contract")[0].id == C["id"]
    # Only in place, no image at all: untested as an image, verified as a stack.
    only = fold([_in_place(C, passed("env", "contract", "gpu"), run=3)])[0]
    assert only.status == "untested" and only.image is None and only.in_place["status"] == "verified"


def test_a_failure_in_place_fails_the_row_for_every_reader():
    bad = _in_place(C, {"gpu": {"status": "fail", "cause": "logprob-mismatch", "checks": [
        {"name": "python", "status": "pass", "level": "env"}, {"name": "verl-modules", "status": "pass",
                                                              "level": "contract"},
        {"name": "gpu:logprobs", "status": "fail", "cause": "logprob-mismatch", "level": "gpu"}]}}, run=2)
    row = fold_combo([rec(C, passed("env", "contract"), img=image(C), run=1), bad])
    assert row.in_place["status"] == "broken" and row.in_place["failure"]["level"] == "gpu"
    # The row's status says it too (compat.md, the counts, every reader): the same lock failed.
    assert row.status == "broken" and (row.failure.level, row.failure.cause) == ("gpu", "logprob-mismatch")
    assert row.failure.detail.startswith("in place")
    # A failure of an older lock is history: re-locked, the row stands on its image again.
    relocked = rec(C, passed("env", "contract"), img=image(C), run=3)
    relocked.lock_hash = "ee" * 32
    again = fold_combo([rec(C, passed("env", "contract"), img=image(C), run=1), bad, relocked])
    assert again.status == "verified" and again.in_place == {} and len(again.history) == 3
    table = build_table([row])
    got, rejected = pick(table, {"hf": True})
    assert got is None and "failed gpu in place on NVIDIA H200: logprob-mismatch" in why_not(rejected[0], Ask())


# ---------------------------------------------------------------- real wheels, a real venv, the real probe


@pytest.mark.network
def test_wheelhouse_venv_and_an_in_place_record(tmp_path, run_cli):
    """A two-pin lock with real wheels from the index: `six` fetched by its lock hash, `packaging`
    taken from the node (this Python has it at that version). The venv is checked to be the lock,
    says what it reused, and `probe --here --results` records the row in place."""
    meta = Metadata()
    have = metadata.version("packaging")
    py = "%d.%d" % sys.version_info[:2]
    lock = ""
    for name, version in (("six", "1.17.0"), ("packaging", have)):
        hashes = [f["hashes"]["sha256"] for f in meta.files(name) if f["filename"].startswith(
            f"{name}-{version}-") or f["filename"].startswith(f"{name}-{version}.")]
        lock += f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes) + "\n"
    c = Combo("0.0.1", "hf", "", "0.0", "cu130", py, glibc="2.17")
    wh = tmp_path / "wh"
    doc = {"schema": SCHEMA, "rows": {}}
    files, got, skipped = add_row(wh, doc, c, {"verl": lock}, meta, {"packaging": have}, lock_hash="ab" * 32,
                                  era="2026-01-01")
    (wh / MANIFEST).write_text(json.dumps(doc))
    assert skipped == 1 and got > 0 and sorted(p.name for p in (wh / "files").iterdir()) == [
        next(f["file"] for f in files if f["name"] == "six").split("/")[1]]
    assert choose_file(meta.files("six"), "1.17.0", pins_of(lock)["six"][1], {}) is not None
    # The venv: six installed from the wheelhouse, packaging linked from this Python, checked.
    venv = tmp_path / "venv"
    info = materialize(c.id, doc["rows"][c.id], wh, venv, sys.executable, use_host=True)
    assert [r["name"] for r in info["reused"]] == ["packaging"] and info["installed"] == 1
    assert "environment matches the lock (2 distributions)" in info["check"]
    # compiled at install (before anything imported six), as the image's bytecode step does
    site = next((venv / "lib").glob("python*/site-packages"))
    assert list((site / "__pycache__").glob("six.cpython-*.pyc")) and "bytecode" in info["seconds"]
    assert "kernels" not in info and info["seconds"]["kernels"] < 1  # no library of JIT_KERNELS in this lock
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import six, packaging; print(six.__version__)"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "1.17.0", out.stderr
    assert json.loads((venv / ROW_FILE).read_text())["row"] == c.id
    # Not the node's own: without --host-packages the row cannot be judged here.
    with pytest.raises(Refused, match="packaging=="):
        materialize(c.id, doc["rows"][c.id], wh, tmp_path / "venv2", sys.executable, use_host=False)
    # The probe in that venv (no torch in this lock: env fails), recorded in place and folded.
    p = run_cli("probe", "--here", "--python-exe", str(venv / "bin" / "python"), "--level", "env",
                "--results", str(tmp_path / "results"), timeout=300)
    assert p.returncode == 1 and "recorded" in p.stderr, p.stderr
    (r,) = [Record.from_dict(json.loads(f.read_text())) for f in (tmp_path / "results" / "records").rglob("*.json")]
    assert r.place["kind"] == IN_PLACE and r.image is None and r.combo["id"] == c.id
    assert r.place["reused"] == info["reused"] and r.lock_hash == "ab" * 32
    row = fold([r])[0]
    assert row.in_place["status"] == "broken" and row.in_place["failure"]["level"] == "env"
    assert Path(r.place["python"]).name == "python"


def test_a_record_cannot_move_the_row_to_another_lock_and_hide_an_in_place_failure():
    """Issue 49: an in-place record stating another lock hash, newer than the real failure, made
    the row's lock its own; the failure of the lock the row was built from went to history."""
    bad = _in_place(C, {"gpu": {"status": "fail", "cause": "logprob-mismatch", "checks": [
        {"name": "gpu:logprobs", "status": "fail", "cause": "logprob-mismatch", "level": "gpu"}]}}, run=2)
    cover = _in_place(C, passed("env", "contract", "gpu"), run=3)
    cover.lock_hash = "ff" * 32
    row = fold_combo([rec(C, passed("env", "contract"), img=image(C), run=1), bad, cover])
    assert row.lock_hash == "ab" * 32 and row.status == "broken" and row.in_place["status"] == "broken"


def test_publish_does_not_fold_a_record_whose_fields_are_not_its_row_or_whose_run_id_is_not_its_time(tmp_path):
    """Issue 49: publish grouped records by the combo.id they state and took the row's fields from
    the newest, so a record could rewrite a row's platform or verl version; and a run id from 2099
    outranked every later verdict (an honest gpu failure among them)."""
    from envbuild.record import Record, write_record
    from envbuild.sign import write_keypair
    from envbuild.table import publish

    res = tmp_path / "results"
    honest = rec(C, {"env": verdict("pass"), "contract": verdict("pass"), "gpu": verdict("fail", "logprob-mismatch")},
                 img=image(C), status="fail", run=5)
    other = combo(verl="0.9.0", engine="hf", ev="", torch="2.11.0", cuda="cu130", python="3.12", platform="linux/arm64")
    lying = rec({**other, "id": C["id"]}, passed("env", "contract", "gpu"), img=image(C, build=7), run=6)
    future = Record(combo=C, stage="probe", status="ok", image=image(C, build=8), probe=passed("env", "contract", "gpu"),
                    run_id="20991231T235959-ffffff", created="2099-12-31T23:59:59Z", lock_hash="ab" * 32)
    backdated = rec(C, passed("env", "contract", "gpu"), img=image(C, build=9), run=7)
    backdated.created = "2026-11-01T00:00:00Z"
    write_all(res, [honest, lying, future, backdated])
    priv, _, _ = write_keypair(tmp_path / "keys")
    refused: list[str] = []
    t = publish(res, priv, tmp_path / "table", refused=refused)
    (row,) = t.rows
    assert row.status == "broken" and row.failure.cause == "logprob-mismatch"
    assert row.combo.verl == "0.9.1" and row.combo.platform == "linux/amd64"
    assert len(refused) == 3, refused
    assert any(f"fields make {other['id']}" in r for r in refused)
    assert any("later than now" in r for r in refused) and any("not its time" in r for r in refused)
