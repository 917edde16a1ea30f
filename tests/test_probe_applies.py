"""Which API contracts apply to a stack is decided by identifiers, not substrings (issue 26,
class 4): FSDP1's `fully_sharded_data_parallel` is not FSDP2's `fully_shard`."""

import importlib
import sys

import pytest

from envbuild.probe.engines import applies_to, verl_uses


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    def make(**files):
        root = tmp_path / "site"
        (root / "verl").mkdir(parents=True)
        (root / "verl" / "__init__.py").write_text("")
        for name, text in files.items():
            (root / "verl" / f"{name}.py").write_text(text)
        monkeypatch.syspath_prepend(str(root))
        for m in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
            monkeypatch.delitem(sys.modules, m)
        importlib.invalidate_caches()
    return make


def test_fsdp1_names_and_comments_are_not_fsdp2(fake_verl):
    fake_verl(fsdp=(
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "import torch.distributed.fsdp.fully_sharded_data_parallel as fsdp1\n"
        "# fully_shard is FSDP2; not used here\n"
        "HELP = 'set strategy=fsdp2 to use fully_shard'\n"))
    assert verl_uses("fully_shard") is False
    ok, why = applies_to("fsdp2", lambda dist: "2.4.0")
    assert not ok and "never uses FSDP2" in why


def test_a_call_of_fully_shard_is_fsdp2(fake_verl):
    fake_verl(fsdp2="from torch.distributed.fsdp import fully_shard\n\ndef wrap(m):\n    return fully_shard(m)\n")
    assert verl_uses("fully_shard") is True
    assert applies_to("fsdp2", lambda dist: "2.6.0")[0] is True
