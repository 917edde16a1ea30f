"""Trust hardening of the signed table (issue 14): hostile ids, freshness and rollback, key
policy, coverage of every published file, atomic publish, one-line errors."""

import json
import os
import time
from pathlib import Path

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

import envbuild.table as table_mod
from envbuild.row import parse_utc
from envbuild.errors import InputError, TrustError
from envbuild.fsutil import safe_name
from envbuild.sign import write_keypair
from envbuild.table import publish
from envbuild.trust import load_verified

A, B = combo(), combo(verl="0.5.0")


@pytest.fixture
def site(tmp_path):
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1),
                    rec(B, {"env": verdict("pass"), "contract": verdict("fail", "import-error")}, img=image(B),
                        status="fail", run=2)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    publish(res, priv, tmp_path / "table")
    return {"res": res, "priv": priv, "pub": pub, "out": tmp_path / "table", "tmp": tmp_path}


def one_line(p):
    return "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def files_under(root):
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


# ---------------------------------------------------------------- names from data


@pytest.mark.parametrize("bad", ["/tmp/evil-abs", "../../../evil", "a/../../evil", "x\n", "x" * 400, ".hidden",
                                 "..", "-rf", "a b", "ä"])
def test_hostile_combination_ids_write_nothing_outside_out_and_exit_2(tmp_path, run_cli, bad):
    res = tmp_path / "work" / "results"
    folder = res / "records" / "x"
    folder.mkdir(parents=True)
    c = {**combo(), "id": bad}
    r = rec(combo(), passed("env", "contract"), img=image(combo()), run=1)
    (folder / f"{r.run_id}.json").write_text(json.dumps({**r.to_dict(), "combo": c}))
    priv, _, _ = write_keypair(tmp_path / "keys")
    before = files_under(tmp_path)
    p = run_cli("publish", "--results", res, "--key", priv, "--out", tmp_path / "work" / "out" / "table")
    assert p.returncode == 2 and one_line(p), p.stderr
    assert files_under(tmp_path) == before  # nothing written anywhere, --out included
    assert not os.path.exists("/tmp/evil-abs.dsse.json")


def test_safe_name_is_fullmatch_and_bounded():
    assert safe_name("verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11") == "verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11"
    for bad in ("x\n", "a/b", "a..b", "", None, 3, "x" * 202, "\x00"):
        with pytest.raises(InputError):
            safe_name(bad)


# ---------------------------------------------------------------- freshness


def test_expired_table_is_refused_unless_allow_rollback(tmp_path, run_cli, monkeypatch):
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(int(time.time()) - 3 * 86400))
    publish(res, priv, tmp_path / "table", expires_days=2)
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    p = run_cli("pick", "--vllm", "0.8.4", "--table", tmp_path / "table", "--pubkey", pub)
    assert p.returncode == 2 and one_line(p) and "expired at" in p.stderr and p.stdout == ""
    p = run_cli("verify", tmp_path / "table", "--pubkey", pub)
    assert p.returncode == 2 and "expired" in p.stderr
    p = run_cli("pick", "--vllm", "0.8.4", "--table", tmp_path / "table", "--pubkey", pub, "--allow-rollback")
    assert p.returncode == 0 and p.stdout.strip() == image(A)["digest"] and "warning" in p.stderr


def test_publish_expires_days_option(tmp_path, run_cli):
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env"), img=image(A), run=1)])
    priv, _, _ = write_keypair(tmp_path / "keys")
    p = run_cli("publish", "--results", res, "--key", priv, "--out", tmp_path / "t", "--expires-days", "7")
    assert p.returncode == 0, p.stderr
    t = json.loads((tmp_path / "t" / "compat.json").read_text())
    assert parse_utc(t["expires"]) - parse_utc(t["generated"]) == 7 * 86400
    p = run_cli("publish", "--results", res, "--key", priv, "--out", tmp_path / "t", "--expires-days", "0")
    assert p.returncode == 2 and one_line(p)


def test_serial_grows_and_an_older_table_is_refused_after_a_newer_one(site, run_cli, tmp_path):
    old_copy = tmp_path / "old-copy"
    import shutil
    shutil.copytree(os.path.realpath(site["out"]), old_copy)
    old_serial = json.loads((old_copy / "compat.json").read_text())["serial"]
    # The next night: B got fixed (so the old table says B is broken, the new one verified).
    write_all(site["res"], [rec(B, passed("env", "contract"), img=image(B, build=1), run=3)])
    publish(site["res"], site["priv"], site["out"])
    new_serial = json.loads((site["out"] / "compat.json").read_text())["serial"]
    assert new_serial > old_serial
    p = run_cli("verify", site["out"], "--pubkey", site["pub"])
    assert p.returncode == 0, p.stderr
    # Replaying the older, validly signed table (a mirror serving yesterday's file):
    for cmd in (("verify", old_copy), ("pick", "--verl", "0.5.0", "--table", old_copy)):
        p = run_cli(*cmd, "--pubkey", site["pub"])
        assert p.returncode == 2 and one_line(p) and f"serial {old_serial} is older than serial {new_serial}" \
            in p.stderr, p.stderr
    p = run_cli("verify", old_copy, "--pubkey", site["pub"], "--allow-rollback")
    assert p.returncode == 0 and "allow-rollback" in p.stderr


def test_identical_republish_keeps_serial_changed_content_raises_it(site):
    first = json.loads((site["out"] / "compat.json").read_text())
    write_all(site["res"], [rec(B, passed("env", "contract"), img=image(B, build=1), run=3)])
    publish(site["res"], site["priv"], site["out"])
    assert json.loads((site["out"] / "compat.json").read_text())["serial"] > first["serial"]


# ---------------------------------------------------------------- keys


def test_first_use_pins_the_key_and_a_changed_key_is_refused(site, run_cli, tmp_path):
    p = run_cli("verify", site["out"])
    assert p.returncode == 0 and "FIRST USE" in p.stderr and "trusted on first use" in p.stdout
    # Attacker: new key, re-signed table saying B works, pubkey.json replaced next to it.
    evil_priv, _, _ = write_keypair(tmp_path / "evil")
    write_all(site["res"], [rec(B, passed("env", "contract", "gpu"), img=image(B, build=9), run=9)])
    publish(site["res"], evil_priv, site["out"])
    for cmd in (("verify", site["out"]), ("pick", "--verl", "0.5.0", "--table", site["out"])):
        p = run_cli(*cmd)
        assert p.returncode == 2 and one_line(p) and "key next to the table changed" in p.stderr, p.stderr
        assert p.stdout == ""


def test_remote_table_needs_a_key_source(site):
    with pytest.raises(TrustError, match="no key to check"):
        (site["out"] / "pubkey.json").unlink()  # neither --pubkey, nor a configured key, nor one to pin
        load_verified(site["out"])


# ---------------------------------------------------------------- coverage of every file


@pytest.mark.parametrize("name", ["compat.md", "index.html", "pubkey.json", "attestations"])
def test_every_published_file_is_covered_by_the_signature(site, run_cli, name):
    real = os.path.realpath(site["out"])
    path = os.path.join(real, name)
    if name == "attestations":
        path = os.path.join(path, os.listdir(path)[0])
    with open(path, "ab") as f:
        f.write(b" ")
    p = run_cli("verify", site["out"], "--pubkey", site["pub"])
    assert p.returncode == 2 and one_line(p) and "sha256 differs" in p.stderr, p.stderr


def test_corrupt_attestation_and_non_utf8_pubkey_are_one_line(site, run_cli):
    att_dir = site["out"] / "attestations"
    att = next(att_dir.iterdir())
    att.write_bytes(b"{not json")
    p = run_cli("verify", site["out"], "--pubkey", site["pub"], "--attestations")
    assert p.returncode == 2 and one_line(p), p.stderr
    bad = site["tmp"] / "latin1.json"
    bad.write_bytes(b'{"keyid": "\xe9\xff"}')
    p = run_cli("verify", site["out"], "--pubkey", bad)
    assert p.returncode == 2 and one_line(p) and "UTF-8" in p.stderr, p.stderr
    (site["out"] / "pubkey.json").write_bytes(b"\xff\xfe\x00garbage")
    p = run_cli("verify", site["out"])  # first use: the key next to the table is unreadable
    assert p.returncode == 2 and one_line(p), p.stderr


def test_attestation_with_a_hostile_structure_is_refused_cleanly(site):
    from envbuild.sign import IN_TOTO_PAYLOAD_TYPE, VerifyError, load_signer, sign_envelope
    from envbuild.verify import verify_attestations
    att = next((site["out"] / "attestations").iterdir())
    signer = load_signer(site["priv"])
    for stmt in ({"subject": "nope", "_type": 3}, [1, 2], {"subject": [{"digest": "x"}]}, "text"):
        att.write_text(json.dumps(sign_envelope(json.dumps(stmt).encode(), IN_TOTO_PAYLOAD_TYPE, signer)))
        t, info = load_verified(site["out"], site["pub"])
        with pytest.raises(VerifyError, match="does not name image"):
            verify_attestations(t, info)
    att.write_text("{oops")
    with pytest.raises(TrustError, match="not a DSSE envelope"):
        verify_attestations(t, info)


# ---------------------------------------------------------------- atomic publish


def test_a_crash_between_writes_leaves_the_old_set_verifiable(site, monkeypatch, run_cli):
    before = json.loads((site["out"] / "compat.json").read_text())
    target_before = os.readlink(site["out"])
    write_all(site["res"], [rec(B, passed("env", "contract"), img=image(B, build=1), run=3)])
    real_write = table_mod.write_atomic
    calls = []

    def crash_on_third(path, data, *a, **kw):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device (injected)")
        return real_write(path, data, *a, **kw)

    monkeypatch.setattr(table_mod, "write_atomic", crash_on_third)
    with pytest.raises(OSError, match="injected"):
        publish(site["res"], site["priv"], site["out"])
    monkeypatch.setattr(table_mod, "write_atomic", real_write)
    assert os.readlink(site["out"]) == target_before  # never switched
    assert json.loads((site["out"] / "compat.json").read_text()) == before
    p = run_cli("verify", site["out"], "--pubkey", site["pub"], "--attestations")
    assert p.returncode == 0, p.stderr
    # The next publish succeeds and removes the half-written folder.
    publish(site["res"], site["priv"], site["out"])
    sites = site["out"].parent / ".table.sites"
    assert len([p for p in sites.iterdir() if p.is_dir()]) == 2  # the current and the previous one
    assert json.loads((site["out"] / "compat.json").read_text())["counts"]["verified"] == 2


def test_a_table_folder_from_an_older_envbuild_is_adopted(tmp_path):
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    legacy = tmp_path / "table"
    legacy.mkdir()
    (legacy / "compat.json").write_text("{}")
    publish(res, priv, legacy)
    assert legacy.is_symlink()
    load_verified(legacy, pub)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="other files"):
        publish(res, priv, other)
    assert (other / "notes.txt").read_text() == "mine" and not (tmp_path / ".mine.sites").exists()


def test_parse_utc_agrees_with_calendar_and_refuses_garbage():
    import calendar
    import random
    rnd = random.Random(7)
    for _ in range(2000):
        t = rnd.randint(0, 4102444800)
        s = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        assert parse_utc(s) == calendar.timegm(time.gmtime(t)) == t
    for bad in ("2026-13-01T00:00:00Z", "2026-01-01T00:00:00Z\n", "2026-01-01", "", None):
        with pytest.raises(ValueError):
            parse_utc(bad)


def test_concurrent_publishes_into_one_folder_leave_a_verifiable_table(site):
    import threading
    errors = []

    def one():
        try:
            publish(site["res"], site["priv"], site["out"])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert os.path.isdir(os.path.realpath(site["out"]))
    load_verified(site["out"], site["pub"])


def test_a_schema_1_table_reads_only_when_allowed_and_not_after_a_newer_serial(site, capsys):
    """Old compat.json (no serial, expires or files) is refused unless --allow-legacy (issue 27: no
    freshness check can hold for it); replayed after a serial was seen, it is a rollback."""
    from envbuild.sign import load_signer, sign_envelope
    from envbuild.row import TABLE_PAYLOAD_TYPE
    d = json.loads((site["out"] / "compat.json").read_text())
    for k in ("serial", "expires", "files"):
        del d[k]
    d["schema"] = 1
    old = site["tmp"] / "v1"
    old.mkdir()
    data = (json.dumps(d, indent=1, sort_keys=True) + "\n").encode()
    (old / "compat.json").write_bytes(data)
    (old / "compat.json.dsse").write_text(json.dumps(sign_envelope(data, TABLE_PAYLOAD_TYPE,
                                                                   load_signer(site["priv"]))))
    with pytest.raises(TrustError, match="schema-1 table .* --allow-legacy"):
        load_verified(old, site["pub"])
    t, _ = load_verified(old, site["pub"], allow_legacy=True)
    assert t.schema == 1 and t.serial is None and t.to_dict()["rows"] == d["rows"]
    assert "no expiry" in capsys.readouterr().err
    load_verified(site["out"], site["pub"])  # the current table: its serial is now remembered
    with pytest.raises(TrustError, match="serial 0 is older"):
        load_verified(old, site["pub"], allow_legacy=True)


# ---------------------------------------------------------------- one identity per table (issue 27)


def test_one_spelling_per_location():
    from envbuild.tablesource import canonical_url, locate
    want = "https://tables.example/static/"
    for url in ("https://tables.example/static/", "https://tables.example//static/", "https://Tables.Example:443/static/./",
                "https://tables.example/static//", "https://tables.example/x/../static/"):
        assert locate(url).identity == want, url
    assert canonical_url("http://h:8080/a//b/.") == "http://h:8080/a/b/"


def test_a_symlink_names_the_table_it_points_at(site, tmp_path):
    """Pinned through one name, a key-2 table reached through a symlink to the same folder is not
    a new first use."""
    from envbuild.tablesource import locate
    link = tmp_path / "alias"
    link.symlink_to(site["out"])
    assert locate(link).identity == locate(site["out"]).identity == str(site["out"])
    load_verified(site["out"])  # first use: pins the key next to the table
    _, pub2, _ = write_keypair(tmp_path / "keys2")
    (os.path.realpath(site["out"]) and (site["out"] / "pubkey.json")).write_bytes(pub2.read_bytes())
    with pytest.raises(TrustError, match="the key next to the table changed"):
        load_verified(link)


def test_serials_count_per_table_and_another_table_at_a_pinned_location_is_refused(tmp_path):
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    a, b = tmp_path / "a", tmp_path / "b"
    ta = publish(res, priv, a)
    write_all(res, [rec(B, passed("env"), img=image(B), run=2)])
    tb = publish(res, priv, b)
    assert ta.table_id and tb.table_id and ta.table_id != tb.table_id and tb.serial >= ta.serial
    load_verified(a)  # first use of a: pins the key and a's table id
    load_verified(b)  # one key, two tables: b's serial does not make a a rollback
    load_verified(a)
    import shutil
    for f in Path(os.path.realpath(b)).iterdir():  # b's files served at a's location
        if f.is_file():
            shutil.copy2(f, Path(os.path.realpath(a)) / f.name)
    with pytest.raises(TrustError, match="is not the table .* pinned for"):
        load_verified(a)


def test_concurrent_first_uses_keep_every_pin(tmp_path, run_cli):
    import concurrent.futures
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1)])
    priv, _, _ = write_keypair(tmp_path / "keys")
    outs = []
    for i in range(12):
        publish(res, priv, tmp_path / f"t{i}")
        outs.append(tmp_path / f"t{i}")
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        procs = list(ex.map(lambda o: run_cli("verify", o), outs))
    assert all(p.returncode == 0 for p in procs), [p.stderr for p in procs if p.returncode]
    state = json.loads((Path(os.environ["ENVBUILD_STATE"]) / "trust.json").read_text())
    assert set(state["keys"]) == {str(o) for o in outs}


def test_verify_names_files_the_signature_does_not_cover(site, run_cli):
    real = Path(os.path.realpath(site["out"]))
    assert run_cli("verify", site["out"], "--pubkey", site["pub"]).returncode == 0
    (real / "attestations").mkdir(exist_ok=True)
    (real / "attestations" / "evil.dsse.json").write_text("{}")
    (real / "evil.html").write_text("<script>")
    p = run_cli("verify", site["out"], "--pubkey", site["pub"])
    assert p.returncode == 2 and "present but not listed" in p.stderr and "evil.html" in p.stderr


def _serve(site_out: Path, served: Path) -> None:
    """What a nightly's deploy does: the site's files replace what the URL serves."""
    import shutil
    if served.exists():
        shutil.rmtree(served)
    shutil.copytree(os.path.realpath(site_out), served)


def test_a_named_table_is_one_series_across_fresh_runners_and_never_goes_back_a_night(tmp_path, monkeypatch):
    """Issue 49: the nightly publishes from a fresh runner, so every night was a new table: a
    reader with --pubkey who saw night 2 took night 1 again, and one who trusted on first use
    refused night 2. With a name (the matrix's repository), the id is the key's and the name's."""
    res = tmp_path / "results"
    priv, pub, _ = write_keypair(tmp_path / "keys")
    served = tmp_path / "served"
    nights = {}
    for night in (1, 2):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", str(1_800_000_000 + night * 86400))
        write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=night)])
        out = tmp_path / f"runner{night}" / "table"  # a fresh machine: no earlier site, no table-id
        nights[night] = (publish(res, priv, out, name="envbuild/verl"), out)
    (t1, out1), (t2, out2) = nights[1], nights[2]
    assert t1.table_id == t2.table_id and t1.name == t2.name == "envbuild/verl" and t2.serial > t1.serial
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    # a reader who trusted on first use takes the next night
    _serve(out1, served)
    assert load_verified(served)[0].serial == t1.serial
    _serve(out2, served)
    assert load_verified(served)[0].serial == t2.serial
    # and nobody goes back a night: neither that reader nor one with --pubkey
    _serve(out1, served)
    with pytest.raises(TrustError, match="serial .* is older than serial .* table 'envbuild/verl'"):
        load_verified(served)
    with pytest.raises(TrustError, match="is older than serial"):
        load_verified(out1, pubkey=pub)
    # another name signed by the same key is another table: refused where this one is pinned
    other = publish(res, priv, tmp_path / "runner3" / "table", name="someone/else")
    assert other.table_id != t1.table_id
    _serve(tmp_path / "runner3" / "table", served)
    with pytest.raises(TrustError, match="is not the table .* pinned for"):
        load_verified(served)


def test_a_table_whose_id_is_not_its_names_is_refused(tmp_path):
    """The id is derived from key and name; a signed table stating another id under the name
    (not something envbuild publishes) is refused rather than counted in either series."""
    from envbuild.sign import load_signer, sign_envelope
    from envbuild.row import TABLE_PAYLOAD_TYPE
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env"), img=image(A), run=1)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    out = tmp_path / "t"
    publish(res, priv, out, name="envbuild/verl")
    real = Path(os.path.realpath(out))
    doc = json.loads((real / "compat.json").read_text())
    doc["table_id"] = "0" * 32
    data = (json.dumps(doc, indent=1) + "\n").encode()
    (real / "compat.json").write_bytes(data)
    (real / "compat.json.dsse").write_text(json.dumps(sign_envelope(data, TABLE_PAYLOAD_TYPE, load_signer(priv))))
    with pytest.raises(TrustError, match="is not the id of the table named 'envbuild/verl'"):
        load_verified(out, pubkey=pub)


def test_a_table_that_fails_verify_pins_nothing_and_remembers_no_serial(tmp_path, run_cli, monkeypatch):
    """Issue 49, item 6: verify pinned the key (first use) and remembered the serial before it
    checked the listed files, so a tampered site with a high serial could lock a reader out of the
    real table. Now a table is remembered only once every check passed."""
    from envbuild.state import TrustStore
    from envbuild.tablesource import locate
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(1_800_000_000))
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    t = publish(res, priv, tmp_path / "table", name="envbuild/verl")
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    real = Path(os.path.realpath(tmp_path / "table"))
    (real / "compat.md").write_text("tampered\n")
    p = run_cli("verify", tmp_path / "table")  # first use: the key beside the table
    assert p.returncode == 2 and "sha256 differs" in p.stderr, p.stderr
    store = TrustStore.load()
    assert store.pinned(locate(tmp_path / "table").identity) is None
    assert store.last_serial(f"{t.keyid}/{t.table_id}") is None
    p = run_cli("verify", tmp_path / "table", "--pubkey", pub)
    assert p.returncode == 2 and TrustStore.load().last_serial(f"{t.keyid}/{t.table_id}") is None
