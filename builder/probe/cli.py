"""`python -m envbuild.probe` (in images: `python -m envbuild_probe`): run levels, write one verdict."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from . import prefetch, sidebyside, warmup
from .verdict import ERROR, FAIL, SKIPPED, Verdict, write_json
from .vocab import ENGINE, ENGINES, EXIT_BAD_INPUT, EXIT_INFRA, EXIT_OF_STATUS, EXPECT_KEYS, LEVELS, QUIET


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envbuild-probe", description=__doc__.splitlines()[0])
    p.add_argument("--level", choices=LEVELS, default="contract", help="a level includes the levels below it")
    p.add_argument("--engine", choices=ENGINES, required=True)
    p.add_argument("--expect-cuda", help="CUDA of the combination, e.g. 12.4 (or 'cpu')")
    p.add_argument("--expect-torch")
    p.add_argument("--expect-engine-version")
    p.add_argument("--expect-verl")
    p.add_argument("--expect-platform", help="the image's platform, e.g. linux/arm64")
    p.add_argument("--json", dest="json_out", help="write the verdict here (default: stdout)")
    p.add_argument("--scratch", help="writable folder for the tiny model (default: a temp dir)")
    p.add_argument("--levels-dir", help="also write each level's verdict to DIR/<level>.json as soon as that "
                   "level ends (one process judges every level; the caller reads them as they appear)")
    p.add_argument("--stop-at-failure", action="store_true",
                   help="run no level above one that fails or errs (the levels above build on it)")
    p.add_argument("--side-by-side", choices=("auto", "yes", "no"), default=os.environ.get("ENVBUILD_PROBE_SIDE_BY_SIDE"),
                   help="with --level gpu: judge the contract level in a process of its own while the gpu level "
                        "runs (auto: on a GPU node, one rank; default from ENVBUILD_PROBE_SIDE_BY_SIDE, else the "
                        "engine's: auto for vllm and hf, measured faster on a GPU node, bench/probe_sidebyside_vllm_h200.json, "
                        "bench/probe_modes_h100.json); the verdict is the same either way")
    p.add_argument("--only", choices=LEVELS, help=argparse.SUPPRESS)  # that level alone (the side-by-side child)
    g = p.add_argument_group("gpu level")
    g.add_argument("--engine-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    g.add_argument("--prompts", type=int, default=4)
    g.add_argument("-n", type=int, default=4, help="responses per prompt (GRPO group size, >= 2)")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--tol-max", type=float, help="override the calibrated logprob tolerance (max abs)")
    g.add_argument("--tol-mean", type=float, help="override the calibrated logprob tolerance (mean abs)")
    g.add_argument("--seed", type=int, default=0)
    return p


def run(args: argparse.Namespace) -> Verdict:
    expect = {k: getattr(args, f"expect_{k}") for k in EXPECT_KEYS if getattr(args, f"expect_{k}")}
    v = Verdict(level=args.level, engine=args.engine, expect=expect)
    upto = LEVELS[:LEVELS.index(args.level) + 1]
    ahead = None
    if "gpu" in upto and not args.only and prefetch.wanted():
        # First: env's `import torch` is the first reader of what it asks for.
        ahead = prefetch.Prefetch(prefetch.TREES + tuple(sorted(ENGINE[args.engine].modules)))
    # The probe's own modules are imported before the CUDA warm-up thread starts importing torch:
    # two threads importing the same standard modules at once can see one half-initialised.
    from .env_level import run_env
    if "contract" in upto:
        # Its child readers start with the contract level, beside verl's import: while torch
        # imports, `pip check` already takes the second core (bench/probe_speed.json).
        from .contract import run_contract
    side = "gpu" in upto and not args.only and sidebyside.wanted(side_by_side(args))
    if "gpu" in upto:
        from . import engines, extcheck, tiny_model, train  # noqa: F401  (imported lazily by the levels)
        from .gpu_level import GpuOptions, run_gpu
        # The tiny model's modules only where no level of this process imports the stack before
        # the gpu level (warmup.py says why).
        warm = warmup.how()
        warmup.start(args.engine_dtype, tiny_model.MODULES if side and warm != "no" else (), beside=warm == "beside")
    steps = {"env": lambda t: run_env(t, expect, args.engine)}
    if "contract" in upto:
        steps["contract"] = lambda t: run_contract(t, expect, args.engine)
    if "gpu" in upto:
        opt = GpuOptions(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens,
                         engine_dtype=args.engine_dtype, tol_max=args.tol_max, tol_mean=args.tol_mean,
                         seed=args.seed, scratch=args.scratch)
        steps["gpu"] = lambda t: _gpu_level(t, expect, args.engine, opt)
    child = None
    if side:
        child = sidebyside.ContractChild(args.engine, expect)  # its imports start now, on another core
    try:
        for lv in upto:
            if args.only and lv != args.only:
                continue
            if child is not None and lv == "contract":
                child.fold_when_done(v, args.levels_dir)
                continue
            # Beside a running contract level the gpu level writes into a verdict of its own.
            target = Verdict(level=lv, engine=args.engine, expect=expect) if child is not None and lv == "gpu" else v
            broke = _level(target, lv, steps[lv])
            if child is not None and lv == "gpu":
                child.join(v)
                if _stops(args, v):
                    break  # the contract level failed: the gpu level above it is not this verdict's
                v.absorb(target.to_dict())
            if args.levels_dir and int(os.environ.get("RANK", "0")) == 0:
                # A level includes those below it, so the verdict so far is this level's verdict.
                write_json(os.path.join(args.levels_dir, f"{lv}.json"), v.to_dict(level=lv))
            if broke or _stops(args, v):
                break
    finally:
        if child is not None:
            child.stop()
        done = ahead.result() if ahead is not None else None  # ended by now, else stopped
        if done is not None:
            v.timings["prefetch"] = done["seconds"]
        v.timings.update(warmup.timings())
    return v


def _gpu_level(v: Verdict, expect: dict, engine: str, opt) -> None:
    """envbuild's engine-level step first (fast: says whether the engine itself broke), then verl's
    own trainer for one GRPO step (whether verl's use of the engine works): verl_step.py."""
    from .gpu_level import run_gpu
    from .verl_step import engine_step_summary, run_verl_step

    t0 = time.perf_counter()
    run_gpu(v, expect, engine, opt)
    engine_step_summary(v, time.perf_counter() - t0)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if int(os.environ.get("RANK", "0")) == 0:
            v.add("verl-step", SKIPPED, "verl's step runs in a single-process probe (this one runs under torchrun)")
        return
    from .contract import gpu_present
    run_verl_step(v, engine, gpu=gpu_present(), scratch=opt.scratch)


def _stops(args: argparse.Namespace, v: Verdict) -> bool:
    """--stop-at-failure and the verdict so far failed or erred: the levels above build on it."""
    return args.stop_at_failure and v.status in (FAIL, ERROR)


def side_by_side(args: argparse.Namespace) -> str:
    """--side-by-side as asked (the flag, else ENVBUILD_PROBE_SIDE_BY_SIDE), else the engine's default."""
    return args.side_by_side or ENGINE[args.engine].side_by_side


def _level(v: Verdict, lv: str, step) -> bool:
    """Run one level into v; True when the probe itself broke (then no level above runs)."""
    try:
        with v.timed(lv), v.at_level(lv):
            step(v)
    except Exception:  # a bug in the probe is "error", never a verdict on the stack
        v.add("probe", ERROR, traceback.format_exc()[-2000:], "probe-error")
        return True
    return False


# Offline and quiet: the probe must never reach a hub, and progress bars only clutter the logs.
QUIET_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}


def main(argv: list[str] | None = None) -> int:
    for k, val in QUIET_ENV.items():
        os.environ.setdefault(k, val)
    # The probe judges the installed environment: `python -m` put the working directory first on
    # sys.path, and a source checkout there (verl's, envbuild's) must not stand in for it.
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", here)]
    args = build_parser().parse_args(argv)
    if args.n < 2:
        print("envbuild-probe: -n must be >= 2 (GRPO needs a group)", file=sys.stderr)
        return EXIT_BAD_INPUT  # as on the host
    try:
        warmup.how()
    except ValueError as e:
        print(f"envbuild-probe: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    v = run(args)
    d = v.to_dict()
    d["timings"]["process"] = round(time.time() - _process_start(), 4)
    if int(os.environ.get("RANK", "0")) == 0:
        if args.json_out:
            write_json(args.json_out, d)
        else:
            json.dump(d, sys.stdout, indent=2, sort_keys=True, default=str)
            print()
        _summary(d)
    return EXIT_OF_STATUS.get(d["status"], EXIT_INFRA)  # the host's table: an error is infrastructure


def _process_start() -> float:
    """Wall-clock start of this process (imports included), from /proc; falls back to now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def _summary(d: dict) -> None:
    for c in d["checks"]:
        if c["status"] not in QUIET:
            first = (c["detail"] or "").splitlines()[0][:160] if c["detail"] else ""
            print(f"  {c['status']:<15} {c['name']}: {first}", file=sys.stderr)
    print(f"probe {d['level']}/{d['engine']}: {d['status']} ({len(d['checks'])} checks, "
          f"{d['timings'].get('process', 0):.1f}s)", file=sys.stderr)
