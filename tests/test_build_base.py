"""envbuild.base without a daemon: mirror discovery, input-hashed tags, reuse, --base choices."""

from __future__ import annotations

import threading
import time

import pytest

from envbuild import base as Bs
from envbuild.errors import InputError


def apt(tmp_path, sources_list="", **d):
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text(sources_list)
    for name, text in d.items():
        (etc / "sources.list.d" / name.replace("_", ".")).write_text(text)
    return etc


def test_host_mirror_reads_deb822_and_skips_security_and_disabled(tmp_path):
    etc = apt(tmp_path, **{
        "debian_sources": "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
                          "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n",
        "other_sources_disabled-by-farm": "Types: deb\nURIs: https://elsewhere.example/x\n"})
    assert Bs.host_mirror("bookworm", etc) == "http://mirror.example/debian"
    assert Bs.host_mirror("jammy", etc) is None  # no Ubuntu mirror on a Debian host


def test_host_mirror_reads_one_line_format(tmp_path):
    etc = apt(tmp_path, "# comment\ndeb [arch=amd64] http://archive.example/ubuntu jammy main\n")
    assert Bs.host_mirror("jammy", etc) == "http://archive.example/ubuntu"


def test_tag_carries_a_hash_of_the_inputs():
    a = Bs.default_tag("bookworm", Bs.inputs("bookworm", "http://m/debian"))
    assert a.startswith("envbuild/base:bookworm-py3-") and len(a.rsplit("-", 1)[1]) == 12
    assert a == Bs.default_tag("bookworm", Bs.inputs("bookworm", "http://m/debian"))
    assert a != Bs.default_tag("bookworm", Bs.inputs("bookworm", "http://other/debian"))
    assert a != Bs.default_tag("bookworm", Bs.inputs("bookworm", "http://m/debian", ("python3",)))


class Present:
    def __init__(self, have):
        self.have = have

    def image_exists(self, ref):
        return ref in self.have


def test_bootstrap_reuses_a_present_base_without_debootstrap(tmp_path, monkeypatch):
    ref = "envbuild/base:bookworm-py3-" + "a" * 12
    monkeypatch.setattr(Bs.shutil, "which", lambda name: None)  # debootstrap missing: must not be needed
    got = Bs.bootstrap(Present({ref}), tag=ref, mirror="http://m/debian", log=lambda s: None)
    assert got.to_dict() == {"kind": "bootstrap", "ref": ref}


def test_two_bootstraps_at_once_make_one_base(isolated_cache, monkeypatch):
    """Two processes (here: threads, each with its own lock file description) asking for one
    absent base: one makes it, the other waits for it and reuses it."""
    ref = "envbuild/base:bookworm-py3-" + "b" * 12
    engine, made, logs = Present(set()), [], []

    def make(engine_, suite, mirror, inp, ref_, platform, log):
        made.append(threading.get_ident())
        time.sleep(0.5)  # debootstrap: long enough for the other caller to arrive
        engine_.have.add(ref_)
        return Bs.Base("bootstrap", ref_)

    monkeypatch.setattr(Bs, "_make", make)
    got = []
    threads = [threading.Thread(target=lambda: got.append(Bs.bootstrap(engine, tag=ref, mirror="http://m/debian",
                                                                       log=logs.append))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(made) == 1 and [g.ref for g in got] == [ref, ref]
    assert logs == [f"base {ref}: present, reused"]  # the one that waited
    assert list((isolated_cache / "base").glob("*.lock"))


def test_bootstrap_rejects_bad_suite():
    with pytest.raises(InputError, match="suite"):
        Bs.bootstrap(Present(set()), suite="bookworm; rm -rf /", mirror="http://m")


def test_resolve_base_choices():
    class C:
        base_image = "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert Bs.resolve_base(None, "nvidia", C()).to_dict() == {"kind": "nvidia", "ref": C.base_image}
    assert Bs.resolve_base(None, "mirror.local/cuda:12.4").to_dict() == {"kind": "image", "ref": "mirror.local/cuda:12.4"}
    with pytest.raises(InputError):
        Bs.resolve_base(None, "--oops")
