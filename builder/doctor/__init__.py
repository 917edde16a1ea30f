"""`envbuild doctor`: catch verl's silent pitfalls before a training run starts.

Input is what the user gives verl's trainer: Hydra overrides after `--` and/or a YAML file. They are
merged over verl's own composed trainer config the way verl merges them (envbuild.verl_config) and
every check reads the merged, resolved config. Each check says pass / warn / fail / skip, one line
why, and the fix. Exit 1 when any fails; 2 when the config itself cannot be read (as verl would stop).

Groups: config (unknown keys), grpo (grouped sampling, KL, advantage normalisation, batch size against
GPU memory), fsdp (offload settings), data (parquet files), output (atomic writes, free space),
ray (cluster and GPUs, rollout ports), env (the probe's env+contract levels, the signed table).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Callable

from .. import errors
from ..errors import InputError
from ..verl_config import CONFIG_NAME, VerlConfig, build_config
from ..probe.hardware import PLATFORMS, parse_platform
from .cluster import check_ray
from .common import FAIL, GROUPS, PASS, SKIP, WARN, Options, Result  # noqa: F401 - the package's face
from .config import check_config
from .data import check_data
from .env import check_env, check_host, installed_versions, run_probe  # noqa: F401
from .fsdp import check_fsdp
from .grpo import check_grpo
from .output import check_output
from .tablecheck import check_table  # noqa: F401

# --------------------------------------------------------------------------- run

CHECKS: dict[str, Callable[[VerlConfig, Options], list[Result]]] = {
    "config": check_config, "grpo": check_grpo, "fsdp": check_fsdp, "data": check_data,
    "output": check_output, "ray": check_ray, "env": check_env,
}


def diagnose(cfg: VerlConfig, opt: Options, skip: set[str] = frozenset()) -> list[Result]:
    out: list[Result] = []
    for group, fn in CHECKS.items():
        if group not in skip:
            out.extend(fn(cfg, opt))
    return out


def add_arguments(p) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="verl trainer overrides, after `--` (key=value, +key=value, ~key, and Hydra's "
                        "--config-name=ppo_megatron_trainer); or first a launch script (`envbuild doctor "
                        "run_grpo.sh`): the overrides its main_ppo command passes")
    p.set_defaults(_passthrough="overrides")  # cli: what follows `--` is main_ppo's, after a script too
    p.add_argument("--config", help="a verl YAML config, or a launch script that runs verl's main_ppo; "
                                    "overrides apply on top of it")
    p.add_argument("--verl", metavar="VERSION",
                   help="judge against this verl release's trainer config (default: the installed verl, "
                        "else the newest recorded release)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--skip", action="append", default=[], choices=GROUPS, help="skip a group of checks (repeatable)")
    p.add_argument("--table", help="signed compatibility table (dir, compat.json, .dsse or URL)")
    p.add_argument("--pubkey", help="public key to verify the table with")
    p.add_argument("--platform", help="the platform whose row the table check reads (default: this machine's)")
    p.add_argument("--insecure", action="store_true",
                   help="skip the table's signature check (a match is then a warning, never a pass)")
    p.add_argument("--probe-timeout", type=_seconds, default=600.0, help="seconds for the probe (default 600)")
    p.add_argument("--ray-timeout", type=_seconds, default=90.0, help="seconds for the Ray query (default 90)")


def _is_script(path: str) -> bool:
    """A launch script, not a YAML: a regular file named *.sh, or starting with #!, or naming
    main_ppo. Anything else (a FIFO, a device) is left to the YAML reader, which refuses it."""
    import os
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        if path.endswith(".sh"):
            return True
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    return head.startswith(b"#!") or b"main_ppo" in head


def _script_input(args) -> tuple[str | None, list[str], Result | None]:
    """(YAML config, overrides, what a launch script left out): a launch script (given as --config
    or as the first argument) is read for the overrides its main_ppo command passes; later
    overrides win, as they would appended to the script's command."""
    import os

    from ..runscope import script_overrides

    config, overrides = args.config, list(args.overrides)
    script = None
    if config and _is_script(config):
        script, config = config, None
    elif overrides and "=" not in overrides[0] and not overrides[0].startswith("~") and _is_script(overrides[0]):
        script, overrides = overrides[0], overrides[1:]
    if script is None:
        return config, overrides, None
    found, left = script_overrides(script)
    if not found and not left:
        raise InputError(script, None, "script", script, "no `python -m verl.trainer.main_ppo key=value ...` "
                         "command in it: give a verl YAML with --config, or the overrides after `--`")
    args._left_out = left
    note = Result("config", "config.script", SKIP if left else PASS,
                  f"{script}: {len(found)} override(s) of its main_ppo command read"
                  + (f"; not judged (their values come from the environment when it runs): {', '.join(left)}"
                     if left else ""))
    return config, found + overrides, note


def _not_judged(results: list[Result], left: list[str]) -> list[Result]:
    """A check about a key the launch script sets from the environment (or whose words name it)
    would judge verl's default instead of the run's value: it says so and judges nothing."""
    if not left:
        return results
    out, seen = [], set()
    for r in results:
        hit = next((k for k in left if r.name == k or r.name.startswith(k + "[")
                    or k.rpartition(".")[2] in f"{r.reason} {r.fix}"), None)
        if hit is None:
            out.append(r)
        elif (r.name.split("[")[0], hit) not in seen:
            seen.add((r.name.split("[")[0], hit))
            out.append(Result(r.group, r.name.split("[")[0], SKIP,
                              f"not judged: it reads {hit}, which the launch script takes from the environment"))
    return out


def run(args) -> int:
    from ..runscope import hydra_flags

    config, overrides, script_note = _script_input(args)
    flags, overrides = hydra_flags(overrides)
    path = flags.get("config-path") or flags.get("config-dir")
    if path and path.rstrip("/") not in ("config", "./config", "verl/trainer/config"):
        raise InputError("command line", None, "--config-path", path,
                         "not verl's own trainer configs (main_ppo's --config-path=config): doctor composes "
                         "only those; give the composed config as a YAML file with --config")
    cfg = build_config(config, overrides, verl=args.verl, config_name=flags.get("config-name") or CONFIG_NAME)
    platform = None
    if args.platform:
        platform = parse_platform(args.platform)
        if platform is None:
            raise InputError("command line", None, "--platform", args.platform, f"not a platform ({', '.join(PLATFORMS)})")
    opt = Options(table=args.table, pubkey=args.pubkey, insecure=args.insecure,
                  probe_timeout=args.probe_timeout, ray_timeout=args.ray_timeout, platform=platform)
    results = ([script_note] if script_note else []) + _not_judged(diagnose(cfg, opt, set(args.skip)),
                                                                   getattr(args, "_left_out", []))
    failed = any(r.status == FAIL for r in results)
    if args.json:
        given = {k: cfg.get(k) for k in cfg.explicit if k not in cfg.deleted}  # what the user set, resolved
        json.dump({"ok": not failed, "counts": _counts(results), "checks": [asdict(r) for r in results],
                   "config": given}, sys.stdout, indent=2, default=str)
        print()
    else:
        print_report(results)
    return errors.VERDICT if failed else errors.OK


def _counts(results: list[Result]) -> dict:
    return {s: sum(1 for r in results if r.status == s) for s in (FAIL, WARN, PASS, SKIP)}


def print_report(results: list[Result], file=None) -> None:
    file = file or sys.stdout
    for r in results:
        print(f"{r.status.upper():<4}  {r.name}: {r.reason}", file=file)
        if r.fix and r.status in (FAIL, WARN):
            print(f"      fix: {r.fix}", file=file)
        if r.group == "data" and "sample" in r.details:
            for k, v in r.details["sample"].items():
                print(f"      sample {k}: {v[:160]}", file=file)
    c = _counts(results)
    print(f"envbuild doctor: {c[FAIL]} fail, {c[WARN]} warn, {c[PASS]} pass, {c[SKIP]} skip", file=file)


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse names the flag and value on failure)."""
    import argparse
    import math
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(v) or v <= 0 or v > 7 * 86400:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds up to a week, not {text!r}")
    return v
