"""Level 3, gpu: rollout -> rule reward -> GRPO advantages -> one FSDP2 actor update -> weight push
-> second rollout, whose engine logprobs must match the trainer's.

Runs on any world size under torchrun (each rank: its own engine and prompts; FSDP2 averages the
gradients); a plain process is world size 1. With the hf engine it also runs on a CPU (gloo).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass

from .classify import classify_exception
from .vocab import ENGINE
from .verdict import ERROR, FAIL, NEEDS_GPU, PASS, Verdict

# |engine logprob - trainer logprob| per sampled token, trainer in fp32, hf engine. Calibrated on the
# H200 and on a CPU (bench/probe_gpu.json, 16 prompts x 8 x 48 tokens, 2 seeds): worst bf16 max 7.7e-3
# (CPU 8.9e-3), mean 1.2e-3; fp32 max 9.5e-7, mean 1.6e-7. Tolerances are about 4x (bf16) and 10x
# (fp32) the worst seen; the old weights sit ~0.27 away, so a missed push cannot pass.
TOLERANCE = {"bfloat16": {"max": 0.04, "mean": 0.005}, "float32": {"max": 1e-5, "mean": 1e-6}}


@dataclass
class GpuOptions:
    prompts: int = 4  # per rank
    n: int = 4  # responses per prompt (GRPO group)
    max_tokens: int = 16
    steps: int = 2  # optimizer steps on the batch (ppo epochs): the second one exercises clip and KL
    lr: float = 5e-3  # large on purpose: the pushed weights must move logprobs well past the tolerance
    kl_coef: float = 0.1
    engine_dtype: str = "bfloat16"
    tol_max: float | None = None
    tol_mean: float | None = None
    seed: int = 0
    scratch: str | None = None


class StageFailed(Exception):
    pass


def run_gpu(v: Verdict, expect: dict, engine: str, opt: GpuOptions) -> None:
    t0 = time.perf_counter()
    try:
        import torch
    except BaseException as e:
        c = classify_exception(e, engine)
        v.add("gpu:import-torch", c.status, c.detail, c.cause)
        return
    v.timings.setdefault("import_torch", round(time.perf_counter() - t0, 4))
    cuda = torch.cuda.is_available()
    if not cuda and not ENGINE[engine].runs_on_cpu:
        v.add("gpu:device", NEEDS_GPU, f"the {engine} path needs a GPU; none is visible", "needs-gpu")
        return
    device_type = "cuda" if cuda else "cpu"
    st = _State(v, engine, opt, torch, device_type)
    try:
        st.run()
    except StageFailed:
        pass
    finally:
        st.finish()


class _State:
    def __init__(self, v: Verdict, engine: str, opt: GpuOptions, torch, device_type: str):
        self.v, self.engine, self.opt, self.torch, self.device_type = v, engine, opt, torch, device_type
        self.engine_obj = None
        self.tmpdir = None
        self.rank, self.world = 0, 1
        self.failed = False
        self.syncs_done = 0
        self.met_at_sync = False  # stopped at a sync point, together with the other ranks

    FSDP_STAGES = ("trainer_setup", "snapshot", "old_logprobs", "update", "snapshot_after", "new_logprobs")

    # -- helpers
    def stage(self, name: str, fn):
        t0 = time.perf_counter()
        try:
            out = fn()
        except StageFailed:
            raise
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            c = classify_exception(e, self.engine)
            status = FAIL if c.status == NEEDS_GPU and self.device_type == "cuda" else c.status
            if self.device_type == "cpu" and name in self.FSDP_STAGES and status == FAIL:
                # FSDP2 on a CPU is a convenience of newer torch (2.6 has no CPU stream events): an
                # older torch is judged on a GPU, not failed here.
                status, c.cause = NEEDS_GPU, "fsdp2-needs-gpu"
                c.detail = f"FSDP2 of torch {self.torch.__version__} does not run on a CPU: {c.detail}"
            self.check(f"gpu:{name}", status, c.detail, c.cause, time.perf_counter() - t0, stop=False)
            self.failed = True
            raise StageFailed(name) from e
        finally:
            if self.device_type == "cuda":
                self.torch.cuda.synchronize()
            self.v.timings[name] = round(time.perf_counter() - t0, 4)
        return out

    def check(self, name, status, detail="", cause=None, seconds=0.0, stop=True):
        self.v.add(name, status, detail, cause, seconds)
        if status in (FAIL, ERROR):
            self.failed = True
            if stop:
                raise StageFailed(name)

    # Ranks agree before each collective section, so that one rank's failure never leaves the
    # others waiting in (or mismatching) an FSDP collective: all stop together instead.
    SYNC_POINTS = 2

    def sync(self, ok: bool) -> bool:
        if self.world == 1:
            return ok
        import torch.distributed as dist
        t = self.torch.tensor([1 if ok else 0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        self.syncs_done += 1
        return bool(t.item())

    def sync_or_stop(self, where: str):
        if not self.sync(not self.failed):
            if not self.failed:
                self.v.add(f"gpu:{where}", FAIL, "another rank failed first (see its checks)", "other-rank-failed")
            self.failed = self.met_at_sync = True
            raise StageFailed(where)

    # -- the run
    def run(self):
        torch, opt, v = self.torch, self.opt, self.v
        from . import tiny_model, train, warmup
        from .engines import ENGINES
        self.rank = int(os.environ.get("RANK", 0))
        local = int(os.environ.get("LOCAL_RANK", 0))
        if self.device_type == "cuda":
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            props = torch.cuda.get_device_properties(self.device)
            v.gpu = {"name": props.name, "capability": ".".join(map(str, torch.cuda.get_device_capability(self.device))),
                     "memory": props.total_memory, "count": torch.cuda.device_count()}
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.device = torch.device("cpu")
            v.gpu = {"name": "cpu"}
        scratch = self.tmpdir = tempfile.mkdtemp(prefix="envbuild-probe-", dir=opt.scratch)
        model_dir = os.path.join(scratch, f"tiny-model-rank{self.rank}")

        def build():
            warmup.wait()  # its imports of the model's modules, when it makes them, end first
            return tiny_model.build(model_dir, opt.seed)

        model, tok, eos, pad = self.stage("build_model", build)
        self.check("gpu:build-model", PASS, f"Qwen2 {sum(p.numel() for p in model.parameters())} params, "
                                            f"vocab {tok.get_vocab_size()}, saved to {model_dir}")
        # After saving: transformers 5 writes checkpoints only on rank 0 once a process group exists.
        self.rank, self.world, local = self.stage("init_distributed", lambda: train.setup_distributed(self.device_type))
        v.gpu["world_size"] = self.world
        self.check("gpu:device", PASS, f"{v.gpu['name']}, world size {self.world}, rank {self.rank}")
        edtype = getattr(torch, opt.engine_dtype)
        self.engine_obj = self.stage("engine_start", lambda: ENGINES[self.engine](
            model_dir, self.device, edtype, opt.seed + self.rank, self.rank, self.world))
        prompts = tiny_model.prompt_ids(tok, opt.prompts, offset=self.rank * opt.prompts)

        groups = self.stage("rollout", lambda: self.engine_obj.generate(prompts, opt.n, opt.max_tokens,
                                                                         opt.seed + self.rank))
        self._check_rollout("gpu:rollout", groups, len(prompts))

        def reward():
            return torch.tensor([[train.rule_reward(tok.decode(t)) for t, _ in g] for g in groups],
                                dtype=torch.float32)
        scores = self.stage("reward", reward)
        adv, adv_raw = self.stage("advantages", lambda: (train.grpo_advantages(scores, True),
                                                          train.grpo_advantages(scores, False)))
        self._check_advantages(scores, adv, adv_raw)

        def setup_trainer():
            import copy
            actor = model.to(self.device)
            ref = copy.deepcopy(actor).eval().requires_grad_(False)
            actor = train.shard_actor(actor, self.world, self.device_type)
            # Build the optimizer right after wrapping: one built after a no_grad forward holds
            # unsharded root tensors, and embeddings/final norm then silently never update.
            optim = torch.optim.AdamW(actor.parameters(), lr=opt.lr, weight_decay=0.0)
            return actor, ref, optim
        self.sync_or_stop("sync-before-update")
        actor, ref, optim = self.stage("trainer_setup", setup_trainer)
        before = self.stage("snapshot", lambda: train.full_state(actor))

        ids, mask, L = train.batch_tensors(prompts, groups, pad, self.device)
        eng_lp1 = self._engine_lp(groups, mask)

        def old():
            with torch.no_grad():
                return train.response_logprobs(actor, ids, L), train.response_logprobs(ref, ids, L)
        old_lp, ref_lp = self.stage("old_logprobs", old)
        d0 = (eng_lp1 - old_lp).abs()[mask.bool()]
        v.metrics["rollout1_logprob_diff"] = {"max": d0.max().item(), "mean": d0.mean().item(), "tokens": d0.numel()}
        adv_tok = adv.reshape(-1, 1).to(self.device).expand_as(mask)

        def update():
            stats = []
            for _ in range(opt.steps):
                logp = train.response_logprobs(actor, ids, L)
                pg, clipfrac = train.policy_loss(logp, old_lp, adv_tok, mask)
                kl = train.masked_mean(train.low_var_kl(logp, ref_lp), mask)
                loss = pg + opt.kl_coef * kl
                stats.append({"loss": loss.item(), "pg": pg.item(), "kl": kl.item(), "clipfrac": clipfrac.item()})
                if not math.isfinite(stats[-1]["loss"]):
                    return stats
                optim.zero_grad(set_to_none=True)
                loss.backward()
                optim.step()
            return stats
        stats = self.stage("update", update)
        v.metrics["update"] = stats
        bad = [s for s in stats if not all(math.isfinite(x) for x in s.values())]
        self.check("gpu:loss-finite", FAIL if bad else PASS, f"{len(stats)} steps: " + ", ".join(
            f"loss {s['loss']:.5f} (pg {s['pg']:.5f}, kl {s['kl']:.2e}, clip {s['clipfrac']:.2f})" for s in stats),
            "non-finite-loss" if bad else None, stop=False)
        after = self.stage("snapshot_after", lambda: train.full_state(actor))
        unchanged = [n for (n, a), (_, b) in zip(before, after) if torch.equal(a, b)]
        self.check("gpu:params-changed", FAIL if unchanged else PASS,
                   f"unchanged: {', '.join(unchanged[:10])}" if unchanged else f"all {len(after)} parameters changed",
                   "params-unchanged" if unchanged else None, stop=False)
        if self.failed:
            raise StageFailed("update")

        pushed = self.stage("push", lambda: self.engine_obj.push((n, t.to(edtype)) for n, t in after))
        self.check("gpu:weight-push", PASS, f"{pushed} tensors pushed as {opt.engine_dtype}")

        groups2 = self.stage("rollout2", lambda: self.engine_obj.generate(prompts, opt.n, opt.max_tokens,
                                                                           opt.seed + 1000 + self.rank))
        self._check_rollout("gpu:rollout2", groups2, len(prompts))
        ids2, mask2, L2 = train.batch_tensors(prompts, groups2, pad, self.device)
        eng_lp2 = self._engine_lp(groups2, mask2)

        def new():
            with torch.no_grad():
                return train.response_logprobs(actor, ids2, L2), train.response_logprobs(ref, ids2, L2)
        self.sync_or_stop("sync-before-check")
        new_lp, ref_lp2 = self.stage("new_logprobs", new)
        m = mask2.bool()
        d, dref = (eng_lp2 - new_lp).abs()[m], (eng_lp2 - ref_lp2).abs()[m]
        tol = dict(TOLERANCE.get(opt.engine_dtype, TOLERANCE["bfloat16"]))
        if opt.tol_max is not None:
            tol["max"] = opt.tol_max
        if opt.tol_mean is not None:
            tol["mean"] = opt.tol_mean
        met = {"max": d.max().item(), "mean": d.mean().item(), "tokens": d.numel(),
               "vs_old_weights_mean": dref.mean().item(), "tolerance": tol, "engine_dtype": opt.engine_dtype}
        v.metrics["logprob_match"] = met
        ok = met["max"] <= tol["max"] and met["mean"] <= tol["mean"]
        self.v.add("gpu:logprob-match", PASS if ok else FAIL,
                   f"|engine - trainer| max {met['max']:.2e} mean {met['mean']:.2e} over {met['tokens']} tokens "
                   f"(tolerance max {tol['max']:.1e}, mean {tol['mean']:.1e}, engine {opt.engine_dtype})",
                   None if ok else "logprob-mismatch")
        # The push must have taken effect: the engine is far closer to the new weights than to the old.
        took = met["vs_old_weights_mean"] > max(tol["mean"], 4 * met["mean"])
        self.v.add("gpu:push-took-effect", PASS if took else FAIL,
                   f"|engine - old weights| mean {met['vs_old_weights_mean']:.2e} vs |engine - new| {met['mean']:.2e}",
                   None if took else "weights-not-pushed")

    def _engine_lp(self, groups, mask):
        torch = self.torch
        rows = [lp + [0.0] * (mask.shape[1] - len(lp)) for g in groups for _t, lp in g]
        return torch.tensor(rows, device=self.device, dtype=torch.float32)

    def _check_rollout(self, name, groups, n_prompts):
        opt = self.opt
        problems = []
        if len(groups) != n_prompts:
            problems.append(f"{len(groups)} groups for {n_prompts} prompts")
        for g in groups:
            if len(g) != opt.n:
                problems.append(f"group of {len(g)}, expected {opt.n}")
            for toks, lps in g:
                if not toks or len(toks) != len(lps) or len(toks) > opt.max_tokens:
                    problems.append(f"{len(toks)} tokens with {len(lps)} logprobs")
                elif not all(math.isfinite(x) and x <= 1e-4 for x in lps):
                    problems.append("logprobs not finite or > 0")
        ntok = sum(len(t) for g in groups for t, _ in g)
        self.check(name, FAIL if problems else PASS, "; ".join(sorted(set(problems))[:5]) or
                   f"{n_prompts} prompts x {opt.n} responses, {ntok} tokens with logprobs",
                   "bad-rollout" if problems else None)

    def _check_advantages(self, scores, adv, adv_raw):
        torch = self.torch
        problems = []
        if not torch.allclose(adv.sum(-1), torch.zeros(adv.shape[0]), atol=1e-4):
            problems.append("normalised advantages do not sum to 0 per group")
        if not torch.allclose(adv_raw.sum(-1), torch.zeros(adv.shape[0]), atol=1e-5):
            problems.append("raw advantages do not sum to 0 per group")
        std = scores.std(-1, keepdim=True)
        if not torch.allclose(adv * (std + 1e-6), adv_raw, atol=1e-5):
            problems.append("normalised != raw / std")
        if not (std > 0).any():
            problems.append("every group has zero reward variance: no learning signal")
        self.v.metrics["rewards"] = {"mean": scores.mean().item(), "groups_with_variance": int((std > 0).sum())}
        self.check("gpu:advantages", FAIL if problems else PASS, "; ".join(problems) or
                   f"GRPO with and without std normalisation, {int((std > 0).sum())}/{scores.shape[0]} groups "
                   "with reward variance", "bad-advantages" if problems else None)

    def finish(self):
        torch, v = self.torch, self.v
        if self.device_type == "cuda":
            try:
                v.peak_gpu_mem = int(torch.cuda.max_memory_allocated(self.device))
            except Exception:
                pass
        try:
            import resource
            v.metrics["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        except Exception:
            pass
        import torch.distributed as dist
        if dist.is_initialized() and self.world > 1:
            if self.failed and not self.met_at_sync and self.syncs_done < self.SYNC_POINTS:
                self.sync(False)  # meets the others at their next sync point
            self._merge_ranks(dist)
        if self.engine_obj is not None:
            try:
                self.engine_obj.close()
            except Exception:
                pass
        if self.tmpdir:
            import shutil
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if dist.is_initialized():  # an engine may have torn the group down itself
            dist.destroy_process_group()

    def _merge_ranks(self, dist):
        """Rank 0's verdict gets every rank's checks (worst status wins) and the max peak memory."""
        from .verdict import Check
        mine = {"checks": [c.__dict__ for c in self.v.checks], "peak": self.v.peak_gpu_mem}
        allr = [None] * self.world
        try:
            dist.all_gather_object(allr, mine)
        except Exception:
            return
        order = {PASS: 0, "not-applicable": 0, "skipped": 0, NEEDS_GPU: 1, FAIL: 2, ERROR: 3}
        merged: dict[str, Check] = {}
        for r, res in enumerate(allr):
            for c in res["checks"]:
                cur = merged.get(c["name"])
                if cur is None or order.get(c["status"], 3) > order.get(cur.status, 3):
                    merged[c["name"]] = Check(**{**c, "detail": f"rank {r}: {c['detail']}"})
        self.v.checks = list(merged.values())
        peaks = [res["peak"] for res in allr if res["peak"] is not None]
        self.v.peak_gpu_mem = max(peaks) if peaks else None
