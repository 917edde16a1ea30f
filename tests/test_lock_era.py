"""One era per combination, era artefacts lifted (never verdicts), full explanations, and index
credentials kept off uv's argv. Network tests take real wheels from the configured index and
serve them from a local index on 127.0.0.1 whose upload dates the test controls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envbuild import index_config as indexmod
from envbuild.index import Metadata
from envbuild.index_config import TorchSource
from envbuild.lock import Locker
from envbuild.lockmodel import exact_pins, explain, split_layers
from envbuild.lockfile import parse_lock
from envbuild.matrix import load_matrix
from envbuild.values import Combo
from envbuild.paths import default_matrix

sys.path.insert(0, str(Path(__file__).parent))
from local_index import LocalIndex, fetch_from_index  # noqa: E402

FULL = "".join(f"{n}=={v} \\\n    --hash=sha256:{n}\n" for n, v in [
    ("torch", "2.6.0"), ("nvidia-cublas-cu12", "12.4.5.8"), ("sympy", "1.13.1"), ("filelock", "3.18.0"),
    ("vllm", "0.8.4"), ("xformers", "0.0.29.post2"), ("transformers", "4.53.2"), ("verl", "0.4.1")])


def test_layers_hold_only_what_torch_and_the_engine_pin_exactly():
    torch_pins = exact_pins(["nvidia-cublas-cu12==12.4.5.8; platform_system == 'Linux'",
                             "sympy==1.13.1; python_version >= '3.9'", "filelock", "triton==3.2.0; python_version > '3.13'"],
                            "3.11")
    assert torch_pins == {"nvidia-cublas-cu12": "12.4.5.8", "sympy": "1.13.1"}  # markers evaluated for 3.11
    layers = split_layers(parse_lock(FULL), torch_pins, "vllm",
                          {"torch": "2.6.0", "xformers": "0.0.29.post2", "transformers": "4.40.0"})
    assert layers == {"torch": ["nvidia-cublas-cu12", "sympy", "torch"], "engine": ["vllm", "xformers"],
                      # floating packages (and a pin the resolution does not have) go to the top layer
                      "verl": ["filelock", "transformers", "verl"]}


def test_explanations_are_wrapped_not_cut():
    long = "  cause: " + " ".join(f"because pkg{i}==1.0 depends on dep{i}>=2" for i in range(60)) + \
           "\n\nhint: `six` was filtered by `exclude-newer`"
    out = explain(long, width=80)
    assert len(long) > 2000 and "dep59>=2" in out and "hint: `six` was filtered" in out
    assert max(len(line) for line in out.splitlines()) <= 80


# --------------------------------------------------------------------------- local index


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """Two real wheels from the configured index: python-dateutil (2024-03-01) needs six>=1.5."""
    indexmod.default_index_url.cache_clear()
    d = tmp_path_factory.mktemp("wheels")
    url = indexmod.default_index_url()
    return {"six": fetch_from_index(url, "six", "six-1.17.0-py2.py3-none-any.whl", d),
            "dateutil": fetch_from_index(url, "python-dateutil", "python_dateutil-2.9.0.post0-py2.py3-none-any.whl", d)}


@pytest.fixture
def index(tmp_path, wheels, monkeypatch, isolated_cache):
    idx = LocalIndex(tmp_path / "index")
    idx.add("simple", wheels["dateutil"], "2024-03-01T18:36:18Z")
    # six as if deleted and uploaded again long after the era: its only release postdates it
    idx.add("simple", wheels["six"], "2025-06-01T00:00:00Z")
    monkeypatch.setenv("UV_DEFAULT_INDEX", idx.url("simple").replace("http://", "http://envbuild:s3cr3t-t0ken@"))
    indexmod.default_index_url.cache_clear()
    yield idx
    idx.close()
    indexmod.default_index_url.cache_clear()


def _combo():
    return Combo(verl="0", engine="hf", engine_version="", torch="0", cuda="cu124", python="3.11", glibc="2.35")


@pytest.mark.network
def test_a_package_filtered_by_the_era_is_lifted_and_recorded(index):
    locker = Locker(load_matrix(default_matrix()), Metadata(index=index.url("simple"), snapshot="/dev/null"))
    d = locker._resolve(["python-dateutil==2.9.0.post0"], "2024-04-01", _combo(), TorchSource("cu124", "cu124", None))
    assert d["status"] == "ok", d["text"]
    assert parse_lock(d["text"])["six"][0] == "1.17.0"
    assert d["relaxed"] == ["six taken from 2025-06-01: no earlier release on the index satisfies the "
                            "requirement (era 2024-04-01)"]
    assert d["built_from_source"] == []
    # the credentials of the index reached uv through its environment, never its command line
    assert locker.argv and not any("s3cr3t" in arg for argv in locker.argv for arg in argv)
    assert all("--exclude-newer-package" not in argv or "six=2025-06-02" in argv for argv in locker.argv)


@pytest.mark.network
def test_unsatisfiable_without_the_artefact_stays_unsatisfiable(index):
    locker = Locker(load_matrix(default_matrix()), Metadata(index=index.url("simple"), snapshot="/dev/null"))
    d = locker._resolve(["python-dateutil==2.9.0.post0", "six<1.5"], "2024-04-01", _combo(),
                        TorchSource("cu124", "cu124", None))
    assert d["status"] == "unsatisfiable"
    assert "six" in d["text"] and d["relaxed"] == []


def _wheel(d: Path, name: str, version: str, requires: list[str] = ()) -> Path:
    """A minimal pure-Python wheel (what the index serves is all uv reads of it)."""
    import base64
    import hashlib
    import zipfile
    path = d / f"{name}-{version}-py3-none-any.whl"
    di = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "",
             f"{di}/METADATA": "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                               + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: envbuild-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(v.encode())}\n" for k, v in files.items()) + f"{di}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in {**files, f"{di}/RECORD": record}.items():
            z.writestr(k, v)
    return path


def test_a_yanked_release_pinned_exactly_by_a_dependency_is_taken_as_pip_takes_it(tmp_path, monkeypatch,
                                                                                   isolated_cache):
    """Issue 26, class 12: engine==X pins dep==Y exactly and Y was yanked later. pip installs Y
    with a warning; uv refuses it unless asked for directly, so the lock was `unsatisfiable`.
    Now Y is stated directly (hash-pinned like every pin) and the row's notes say so."""
    idx = LocalIndex(tmp_path / "index")
    w = tmp_path / "w"
    w.mkdir()
    idx.add("simple", _wheel(w, "enginepkg", "1.0", ["tokpkg==4.51.0"]), "2024-03-01T00:00:00Z")
    idx.add("simple", _wheel(w, "tokpkg", "4.51.0"), "2024-02-01T00:00:00Z", yanked="broken tokenizer config")
    idx.add("simple", _wheel(w, "tokpkg", "4.51.1"), "2024-02-15T00:00:00Z")
    monkeypatch.setenv("UV_DEFAULT_INDEX", idx.url("simple"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uvc"))
    indexmod.default_index_url.cache_clear()
    try:
        locker = Locker(load_matrix(default_matrix()), Metadata(index=idx.url("simple"), snapshot="/dev/null"))
        d = locker._resolve(["enginepkg==1.0"], "2024-04-01", _combo(), TorchSource("cu124", "cu124", None))
        assert d["status"] == "ok", d["text"]
        pins = parse_lock(d["text"])
        assert pins["tokpkg"][0] == "4.51.0" and pins["tokpkg"][1]  # the yanked pin, with its hash
        assert d["relaxed"] == ["tokpkg 4.51.0 is yanked (broken tokenizer config); taken because enginepkg "
                                "pins it exactly, as pip install does (with a warning)"]
        # a yanked release nobody pins exactly is still not taken
        d2 = locker._resolve(["tokpkg<4.51.1"], "2024-04-01", _combo(), TorchSource("cu124", "cu124", None))
        assert d2["status"] == "unsatisfiable"
    finally:
        idx.close()
        indexmod.default_index_url.cache_clear()


def _backtrack_index(tmp_path, monkeypatch, q_requires: str):
    """p needs c (any), q needs `q_requires`; b 2.0 caps c at 1.0, b 1.0 (2019) caps nothing.
    uv decides c (met first, through p) at its newest and backtracks b to 1.0."""
    idx = LocalIndex(tmp_path / "index")
    w = tmp_path / "w"
    w.mkdir()
    for name, version, requires, day in [("pkgp", "1.0", ["pkgc"], "2026-01-01"), ("pkgq", "1.0", [q_requires], "2026-01-01"),
                                         ("pkgb", "1.0", ["pkgc"], "2019-05-01"), ("pkgb", "2.0", ["pkgc<=1.0"], "2025-06-01"),
                                         ("pkgb", "2.1", ["pkgc<=1.0"], "2025-09-01"),
                                         ("pkgc", "1.0", [], "2025-01-01"), ("pkgc", "2.0", [], "2026-02-01")]:
        idx.add("simple", _wheel(w, name, version, requires), f"{day}T00:00:00Z")
    monkeypatch.setenv("UV_DEFAULT_INDEX", idx.url("simple"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uvc"))
    indexmod.default_index_url.cache_clear()
    return idx


def test_a_release_years_older_than_the_era_that_uv_backtracked_to_gets_a_floor(tmp_path, monkeypatch, isolated_cache):
    """verl 0.9.1 + vLLM 0.24.0 locked datasets 1.1.1 (2020) beside fsspec 2026.9.0: uv kept the
    newest fsspec it met first and walked datasets back to a release without an fsspec cap, one
    that cannot import with the era's pyarrow, so verl's trainer stopped at import on the GPU.
    Here pkgb plays datasets and pkgc fsspec: the lock takes pkgb 2.1 with pkgc 1.0 and says why."""
    idx = _backtrack_index(tmp_path, monkeypatch, "pkgb")
    try:
        locker = Locker(load_matrix(default_matrix()), Metadata(index=idx.url("simple"), snapshot="/dev/null"))
        first, _ = locker._resolve_era(["pkgp==1.0", "pkgq==1.0"], "2026-03-01", _combo(), TorchSource("cu124", "cu124", None))
        assert parse_lock(first["text"])["pkgb"][0] == "1.0", "uv no longer backtracks here: the test shows nothing"
        d = locker._resolve(["pkgp==1.0", "pkgq==1.0"], "2026-03-01", _combo(), TorchSource("cu124", "cu124", None))
        assert d["status"] == "ok", d["text"]
        pins = parse_lock(d["text"])
        assert (pins["pkgb"][0], pins["pkgc"][0]) == ("2.1", "1.0")
        assert d["relaxed"] == ["pkgb 2.1 taken, not 1.0 of 2019-05-01: uv had backtracked pkgb to a release over 3 "
                                "years older than the era 2026-03-01 (asked: pkgb>=2.0)"]
    finally:
        idx.close()
        indexmod.default_index_url.cache_clear()


def test_an_old_release_a_dependent_caps_it_to_is_a_choice_not_a_backtrack(tmp_path, monkeypatch, isolated_cache):
    """sympy's `mpmath<1.4` makes mpmath 1.3.0 (2023) the answer; a floor there would send uv
    back through older sympy, hydra-core, omegaconf releases (the first version of this rule took
    hydra-core to 0.11.3). A dependent's cap leaves the pin alone, with no note."""
    idx = _backtrack_index(tmp_path, monkeypatch, "pkgb<2")
    try:
        locker = Locker(load_matrix(default_matrix()), Metadata(index=idx.url("simple"), snapshot="/dev/null"))
        d = locker._resolve(["pkgp==1.0", "pkgq==1.0"], "2026-03-01", _combo(), TorchSource("cu124", "cu124", None))
        assert d["status"] == "ok", d["text"]
        assert (parse_lock(d["text"])["pkgb"][0], d["relaxed"]) == ("1.0", [])
    finally:
        idx.close()
        indexmod.default_index_url.cache_clear()
