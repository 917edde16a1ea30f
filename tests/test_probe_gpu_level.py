"""The gpu level's whole logic with the hf engine on a CPU (gloo): rollout, reward, GRPO, an FSDP2
update, weight push, second rollout, logprob match. Plus the GRPO/KL formulas on known numbers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from envbuild.probe import train  # noqa: E402
from envbuild.probe_exec import probe_here  # noqa: E402

CPU = {"CUDA_VISIBLE_DEVICES": ""}


def test_grpo_advantages_known_values():
    s = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    raw = train.grpo_advantages(s, norm_by_std=False)
    assert torch.allclose(raw, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    norm = train.grpo_advantages(s, norm_by_std=True)
    assert torch.allclose(norm[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6))
    assert torch.equal(norm[1], torch.zeros(4))  # no variance: no signal, no division blow-up
    single = train.grpo_advantages(torch.tensor([[3.0]]))
    assert torch.allclose(single, torch.tensor([[3.0]]))  # group of one: mean 0, std 1


def test_low_var_kl_and_clipped_loss():
    lp = torch.tensor([-1.0, -2.0])
    assert torch.equal(train.low_var_kl(lp, lp), torch.zeros(2))
    kl = train.low_var_kl(torch.tensor([-1.0]), torch.tensor([-1.5]))
    d = -0.5
    assert torch.allclose(kl, torch.tensor([math.exp(d) - d - 1]))
    assert train.low_var_kl(torch.tensor([0.0]), torch.tensor([-100.0])).item() <= 10  # clamped
    # ratio 2 with positive advantage is clipped at 1.2; with negative advantage the unclipped term wins
    mask = torch.ones(1)
    loss, frac = train.policy_loss(torch.log(torch.tensor([2.0])), torch.zeros(1), torch.tensor([1.0]), mask)
    assert math.isclose(loss.item(), -1.2, rel_tol=1e-6) and frac.item() == 1.0
    loss, _ = train.policy_loss(torch.log(torch.tensor([2.0])), torch.zeros(1), torch.tensor([-1.0]), mask)
    assert math.isclose(loss.item(), 2.0, rel_tol=1e-6)


def test_rule_reward():
    assert train.rule_reward("abc") == 1.0 and train.rule_reward("xyz") == 0.0 and train.rule_reward("") == 0.0


def test_gpu_level_hf_on_cpu():
    v = probe_here(level="gpu", engine="hf", expect={"cuda": torch.version.cuda or "cpu"}, timeout=900,
                   extra_env=CPU)
    checks = {c["name"]: c for c in v["checks"]}
    assert v["status"] == "pass", [c for c in v["checks"] if c["status"] != "pass"]
    for name in ("gpu:rollout", "gpu:advantages", "gpu:loss-finite", "gpu:params-changed", "gpu:weight-push",
                 "gpu:rollout2", "gpu:logprob-match", "gpu:push-took-effect"):
        assert checks[name]["status"] == "pass", checks.get(name)
    m = v["metrics"]["logprob_match"]
    assert m["tokens"] > 0 and m["max"] <= m["tolerance"]["max"] and m["vs_old_weights_mean"] > 10 * m["mean"]
    assert len(v["metrics"]["update"]) == 2 and v["gpu"] == {"name": "cpu", "world_size": 1}
    for stage in ("build_model", "rollout", "update", "push", "rollout2"):
        assert v["timings"][stage] >= 0


def _probe_with_patch(tmp_path, patch: str) -> dict:
    """Run the gpu level in a child process after monkeypatching the engine."""
    out = tmp_path / "v.json"
    code = ("import sys; import envbuild.probe.engines as e\n" + patch +
            "\nfrom envbuild.probe.cli import main\n"
            f"sys.exit(main(['--level', 'gpu', '--engine', 'hf', '--json', {str(out)!r}]))")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **CPU}, capture_output=True, timeout=900)
    return json.loads(out.read_text())


def test_a_push_that_does_nothing_is_caught(tmp_path):
    v = _probe_with_patch(tmp_path, "e.HFEngine.push = lambda self, named: len(list(named))")
    checks = {c["name"]: c for c in v["checks"]}
    assert v["status"] == "fail"
    assert checks["gpu:logprob-match"]["status"] == "fail"
    assert checks["gpu:push-took-effect"]["cause"] == "weights-not-pushed"


@pytest.mark.slow
def test_gpu_level_world_size_2_torchrun_on_cpu():
    v = probe_here(level="gpu", engine="hf", expect={}, timeout=900, nproc=2, extra_env=CPU)
    assert v["status"] == "pass", [c for c in v["checks"] if c["status"] != "pass"]
    assert v["gpu"]["world_size"] == 2
    cmd = v["runner"]["cmd"]  # (behind `unshare --net` where the host allows it: torchrun on loopback)
    assert cmd[cmd.index("-m"):cmd.index("-m") + 2] == ["-m", "torch.distributed.run"]
