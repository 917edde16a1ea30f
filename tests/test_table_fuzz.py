"""Fuzz the table readers: whatever the bytes of a published table's files, reading it ends in a
result or one EnvbuildError (one line, an exit code), never another exception. Short here
(ENVBUILD_FUZZ_EXAMPLES raises the count for a longer run)."""

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.errors import EnvbuildError
from envbuild.sign import write_keypair
from envbuild.table import publish
from envbuild.trust import load_verified
from envbuild.verify import verify_attestations, verify_files

EXAMPLES = int(os.environ.get("ENVBUILD_FUZZ_EXAMPLES", "60"))
FILES = ["compat.json.dsse", "compat.json", "pubkey.json", "compat.md", "ATTESTATION"]
_stats = {"tries": 0, "accepted": 0, "clean_errors": 0}
_pristine_rows: list = []


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    res = tmp / "results"
    a, b = combo(), combo(verl="0.5.0")
    write_all(res, [rec(a, passed("env", "contract"), img=image(a), run=1),
                    rec(b, {"env": verdict("pass"), "contract": verdict("fail", "import-error")}, img=image(b),
                        status="fail", run=2)])
    priv, pub, _ = write_keypair(tmp / "keys")
    publish(res, priv, tmp / "table")
    site = tmp / "site"
    shutil.copytree(os.path.realpath(tmp / "table"), site)
    _pristine_rows[:] = [r.to_dict() for r in load_verified(site, pub)[0].rows]
    return site, pub


def _target(site, name):
    if name == "ATTESTATION":
        d = site / "attestations"
        return d / sorted(os.listdir(d))[0]
    return site / name


def _read_all(site, pub) -> list:
    t, info = load_verified(site, pub if pub else None)
    verify_attestations(t, info)  # before the file hashes, so that its own parsing is fuzzed too
    verify_files(t, info)
    return [r.to_dict() for r in t.rows]  # every row typed (the lazy rows must not hide a crash)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=12)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(FILES), edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1,
                                                   max_size=4), pinned=st.booleans())
def test_byte_edits_end_in_a_result_or_one_clean_error(pristine, tmp_path_factory, name, edits, pinned):
    site, pub = pristine
    work = tmp_path_factory.mktemp("f") / "t"
    shutil.copytree(site, work)
    path = _target(work, name)
    data = bytearray(path.read_bytes())
    for where, byte in edits:
        data[min(int(where * len(data)), len(data) - 1)] = byte
    path.write_bytes(bytes(data))
    _check(work, pub if pinned else None)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["compat.json.dsse", "pubkey.json", "ATTESTATION"]), value=json_values)
def test_arbitrary_json_in_place_of_a_file_is_a_clean_error(pristine, tmp_path_factory, name, value):
    site, pub = pristine
    work = tmp_path_factory.mktemp("j") / "t"
    shutil.copytree(site, work)
    _target(work, name).write_text(json.dumps(value))
    _check(work, None if name == "pubkey.json" else pub)


ROW_EDITS = {"status": ["verified", "broken", "untested"], "best_level": ["gpu", "contract", None],
             "image": [{"pinned": "evil.example/x@sha256:" + "e" * 64, "digest": "sha256:" + "e" * 64,
                        "ref": "evil.example/x:t", "size": 1}]}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=st.integers(0, 1), field=st.sampled_from(sorted(ROW_EDITS)), choice=st.integers(0, 2),
       pinned=st.booleans())
def test_a_consistent_forgery_of_a_row_is_refused(pristine, tmp_path_factory, row, field, choice, pinned):
    """compat.json and the envelope's payload changed together (what a forger who cannot sign
    writes): only the signature can refuse it, and then no altered row may come back."""
    import base64

    site, pub = pristine
    work = tmp_path_factory.mktemp("g") / "t"
    shutil.copytree(site, work)
    doc = json.loads((work / "compat.json").read_text())
    values = ROW_EDITS[field]
    doc["rows"][row][field] = values[choice % len(values)]
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    (work / "compat.json").write_bytes(data)
    env = json.loads((work / "compat.json.dsse").read_text())
    env["payload"] = base64.b64encode(data).decode()
    (work / "compat.json.dsse").write_text(json.dumps(env))
    _check(work, pub if pinned else None)


def _check(work, pub):
    _stats["tries"] += 1
    try:
        rows = _read_all(work, pub)
    except EnvbuildError as e:
        assert "\n" not in str(e).strip(), str(e)
        assert e.exit_code in (1, 2, 3)
        _stats["clean_errors"] += 1
        return
    # Accepted: then it is the table that was signed, row for row (an edit that changed a row and
    # was still accepted is a forgery that got through).
    assert rows == _pristine_rows
    _stats["accepted"] += 1


def test_fuzz_counts_are_reported(capsys):
    """Runs after the fuzz tests above (file order): they ran, most edits were refused, and the
    counts are printed for the record."""
    with capsys.disabled():
        print(f"\ntable fuzz: {_stats}")
    assert _stats["tries"] >= EXAMPLES  # the fuzz tests ran (hypothesis may skip duplicates)
    assert _stats["clean_errors"] > _stats["accepted"] and _stats["tries"] == _stats["clean_errors"] + _stats["accepted"]
