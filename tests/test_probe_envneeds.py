"""Environment needs are caveats, not verdicts: an import that reaches the network or writes the
home directory; version ranges of the API checks; the level stamped on every check."""

import socket
import sys

import pytest

from envbuild.probe.classify import classify_exception, classify_message
from envbuild.probe.contract import _import_check
from envbuild.probe.engines import api_checks, applies_to, engine_class
from envbuild.probe.envguard import guard
from envbuild.probe.verdict import Verdict
from envbuild.probe.versions import parse, satisfies


def _mod(tmp_path, monkeypatch, name, text):
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def test_import_that_downloads_and_fails_offline_is_a_caveat(tmp_path, monkeypatch):
    # What a tokenizer module does when it fetches its vocabulary at import (urllib, uncaught).
    name = _mod(tmp_path, monkeypatch, "fetches_vocab", (
        "import urllib.request\n"
        "VOCAB = urllib.request.urlopen('https://huggingface.co/gpt2/resolve/main/vocab.json', timeout=5).read()\n"))
    v = Verdict(level="contract", engine="vllm")
    with v.at_level("contract"):
        _import_check(v, name, "vllm", on_gpu=False)
    c = v.checks[0]
    assert (c.status, c.cause, c.level) == ("needs-network", "needs-network", "contract")
    assert "huggingface.co" in c.detail
    assert v.status == "pass"  # a caveat, not a verdict
    d = v.to_dict()
    assert d["caveats"] and d["caveats"][0]["kind"] == "needs-network" and d["caveats"][0]["module"] == name
    assert "https://huggingface.co/gpt2/resolve/main/vocab.json" in d["caveats"][0]["what"]


def test_import_that_tries_the_network_but_falls_back_works_with_a_caveat(tmp_path, monkeypatch):
    name = _mod(tmp_path, monkeypatch, "tries_hub", (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('huggingface.co', 443), timeout=5)\n"
        "    ONLINE = True\n"
        "except OSError:\n"
        "    ONLINE = False\n"))
    v = Verdict(level="contract", engine="sglang")
    _import_check(v, name, "sglang", on_gpu=False)
    c = v.checks[0]
    assert c.status == "pass" and "huggingface.co:443" in c.detail and "works offline" in c.detail
    assert sys.modules[name].ONLINE is False  # the guard refused it, wherever the probe runs
    assert v.caveats[0]["kind"] == "needs-network"


def test_loopback_is_not_the_network():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)  # the kernel completes the handshake from the backlog: no accept needed
    with guard() as needs:
        socket.create_connection(srv.getsockname(), timeout=5).close()
    srv.close()
    assert needs.network == []


def test_writable_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    name = _mod(tmp_path, monkeypatch, "writes_cache", (
        "import os\n"
        "open(os.path.expanduser('~/.cache/assets.json'), 'w').write('{}')\n"))
    v = Verdict(level="contract", engine="hf")
    _import_check(v, name, "hf", on_gpu=False)
    assert v.checks[0].status == "pass" and "~/.cache/assets.json" in v.checks[0].detail
    assert v.caveats == [{"kind": "needs-writable-home", "check": f"import:{name}", "module": name,
                          "what": "~/.cache/assets.json"}]
    err = PermissionError(13, "Permission denied")
    err.filename = str(home / ".cache" / "x")
    c = classify_exception(err, "vllm")
    assert (c.status, c.cause) == ("needs-writable-home", "needs-writable-home")


@pytest.mark.parametrize("msg,needle", [
    ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
     "exceeded with url: /api/models/gpt2 (Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection "
     "object>: Failed to resolve 'huggingface.co' ([Errno -3] Temporary failure in name resolution)\"))",
     "huggingface.co"),
    ("OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached "
     "files and it looks like gpt2 is not the path to a directory containing a file named config.json.",
     "https://huggingface.co"),
    ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and "
     "outgoing traffic has been disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' "
     "to False.", "fails offline"),
])
def test_network_messages(msg, needle):
    c = classify_message(msg, "vllm")
    assert (c.status, c.cause) == ("needs-network", "needs-network") and needle in c.detail


def test_gpu_need_anywhere_in_the_chain_wins():
    """An engine falling back to another engine's kernels because libcuda is missing needs a GPU
    (it is not "another engine's module")."""
    try:
        try:
            raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")
        except ImportError:
            import vllm_not_installed_here  # noqa: F401
    except ImportError as e:
        c = classify_exception(e, "sglang")
    assert (c.status, c.cause) == ("needs-gpu", "no-driver")


def test_own_engine_module_naming_another_engine_is_judged(tmp_path, monkeypatch):
    name = _mod(tmp_path, monkeypatch, "own_engine_mod", "import vllm_custom_ops_missing\n")
    from envbuild.probe import vocab
    real = vocab.engine_of_module
    monkeypatch.setattr("envbuild.probe.classify.engine_of_module",
                        lambda top: "vllm" if top == "vllm_custom_ops_missing" else real(top))
    v = Verdict(level="contract", engine="sglang")
    _import_check(v, name, "sglang", on_gpu=False, own=False)
    assert v.checks[-1].status == "not-applicable"
    sys.modules.pop(name, None)
    _import_check(v, name, "sglang", on_gpu=False, own=True)
    assert (v.checks[-1].status, v.checks[-1].cause) == ("fail", "engine-module-broken")


def test_versions_match_packaging():
    from packaging.version import Version
    vs = ["0.4.4", "0.4.4.post1", "0.4.5rc1", "0.4.5", "0.4.10", "2.6", "1.0.dev1", "1.0a1", "1.0", "1.0.post1"]
    for a in vs:
        for b in vs:
            assert (parse(a) < parse(b)) == (Version(a) < Version(b)), (a, b)
    assert satisfies("2.6.0+cu124", ">=2.4") and not satisfies("2.3.1", ">=2.4")
    assert satisfies("0.8.4", "==0.8.*") and satisfies("0.4.6.post5", ">=0.4.4, <0.5") and not satisfies(None, ">=1")


def test_api_checks_outside_their_versions_are_not_applicable():
    old = {"torch": "2.3.1", "transformers": "4.36.2", "sglang": "0.3.6", "vllm": "0.5.4"}.get
    got = {n: (s, c) for n, s, _d, c in api_checks("sglang", versions=old)}
    assert got == {"fsdp2": ("not-applicable", "version-out-of-range"),
                   "transformers": ("not-applicable", "version-out-of-range"),
                   "sglang": ("not-applicable", "version-out-of-range")}
    ok, why = applies_to("vllm", {"vllm": "0.5.4"}.get)
    assert not ok and why == "applies to vllm>=0.6.3; installed vllm 0.5.4"


def test_function_entry_point_resolves_to_its_class(tmp_path, monkeypatch):
    (tmp_path / "oldeng.py").write_text("class Engine:\n    def generate(self, input_ids=None): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def Engine(*a, **kw):  # what some releases export: a function building the engine lazily
        pass
    assert engine_class(Engine, "nowhere.at.all:Engine", "oldeng:Engine").__name__ == "Engine"
    with pytest.raises(AttributeError, match="is a function"):
        engine_class(Engine, "nowhere.at.all:Engine")


def test_every_check_carries_its_level(capsys):
    from envbuild.probe.cli import build_parser, run
    v = run(build_parser().parse_args(["--level", "contract", "--engine", "hf"]))
    assert v.checks and all(c.level in ("env", "contract") for c in v.checks)
    assert {c.level for c in v.checks if c.name in ("python", "pip-check")} == {"env"}


def test_background_readers_run_in_child_processes(tmp_path, monkeypatch):
    from envbuild.probe.contract import Background
    site = tmp_path / "site"
    (site / "verl" / "workers" / "rollout").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("")
    (site / "verl" / "workers" / "__init__.py").write_text("")
    (site / "verl" / "workers" / "rollout" / "__init__.py").write_text("from vllm import LLM\n")
    monkeypatch.syspath_prepend(str(site))
    b = Background.start("sglang")
    st = b.static()
    rep = b.extensions()
    assert b.from_child == {"static", "ext"}
    assert st["owners"]["verl.workers.rollout"]["engines"] == ["vllm"]
    assert st["owners"]["verl.workers.rollout"]["judged"] is False
    assert isinstance(rep.scanned, dict)


def test_a_probe_crash_outside_a_level_has_no_level():
    v = Verdict(level="gpu", engine="hf")
    with v.at_level("env"):
        v.add("python", "pass")
    v.add("probe", "error", "Traceback ...", "probe-error")
    assert [c.level for c in v.checks] == ["env", None]  # the table counts it against every level
