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
from envbuild.verify import load_verified, verify_attestations, verify_files

EXAMPLES = int(os.environ.get("ENVBUILD_FUZZ_EXAMPLES", "60"))
FILES = ["compat.json.dsse", "compat.json", "pubkey.json", "compat.md", "ATTESTATION"]
_stats = {"tries": 0, "accepted": 0, "clean_errors": 0}


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
    return site, pub


def _target(site, name):
    if name == "ATTESTATION":
        d = site / "attestations"
        return d / sorted(os.listdir(d))[0]
    return site / name


def _read_all(site, pub):
    t, info = load_verified(site, pub if pub else None)
    verify_attestations(t, info)  # before the file hashes, so that its own parsing is fuzzed too
    verify_files(t, info)
    for r in t.rows:  # every row typed (the lazy rows must not hide a crash)
        r.to_dict()


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


def _check(work, pub):
    _stats["tries"] += 1
    try:
        _read_all(work, pub)
        _stats["accepted"] += 1
    except EnvbuildError as e:
        assert "\n" not in str(e).strip(), str(e)
        assert e.exit_code in (1, 2, 3)
        _stats["clean_errors"] += 1


def test_fuzz_counts_are_reported(capsys):
    with capsys.disabled():
        print(f"\ntable fuzz: {_stats}")
