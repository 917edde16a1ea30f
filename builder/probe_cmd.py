"""`envbuild probe`: run the probe in a container (`IMAGE`), in this Python (`--here`), or over
a Ray cluster (`--ray`). The running itself is envbuild.probe_run's; this is the command line."""

from __future__ import annotations

import json
import os
import shutil
import sys

from .errors import EnvbuildError, InputError, UsageError
from .fanout import add_ray_arguments, run_from_args
from .fsutil import write_json_atomic
from .materialize import read_row, record_in_place
from .probe_exec import DEFAULT_TIMEOUT, probe_here
from .probe_run import probe_image
from .selector import selectors_from_args
from .outcome import exit_of_verdict
from .probe.vocab import DEFAULT_ENGINE, LEVELS, QUIET
from .probe.hardware import parse_variant

# ----------------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    p.add_argument("image", nargs="?", help="image to probe (omit with --here or --ray)")
    p.add_argument("--here", action="store_true", help="probe the current Python environment, no Docker")
    p.add_argument("--python-exe", metavar="PATH",
                   help="with --here: probe the environment of this interpreter (default: the current one)")
    p.add_argument("--level", choices=LEVELS, default="contract", help="a level includes the levels below it")
    p.add_argument("--expect-cuda", help="the accelerator variant the image's torch must be built for (cu124 or "
                                         "12.4, rocm6.2; 'cpu' for a CPU build); default: --cuda")
    p.add_argument("--expect-torch", help="default: --torch")
    p.add_argument("--expect-engine-version", help="default: the version given with --vllm/--sglang")
    p.add_argument("--expect-verl", help="default: --verl")
    p.add_argument("--timeout", type=float, help="seconds before the probe is killed (default per level: "
                   + ", ".join(f"{k} {v:.0f}" for k, v in DEFAULT_TIMEOUT.items()) + ")")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) for the gpu level, via torchrun")
    p.add_argument("--docker", default="docker", help="docker client (default: /usr/bin/docker if present)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON instead of the summary")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the verdict JSON to FILE")
    p.epilog = ("The selectors (--engine/--vllm/--sglang/--hf, --cuda, --torch, --verl, --platform) name the combination: "
                "what an IMAGE or --here is expected to hold, or which recorded images --ray probes. "
                "Exit status (the host's table, the probe in an image exits with the same): 0 pass, 1 fail or "
                "timeout (a verdict), 2 bad arguments, "
                "3 not judged here (the probe or docker broke, or a check needs a GPU).")
    add_ray_arguments(p)  # --ray ADDRESS, --results, --retries and the selectors (envbuild.fanout)


def _declared(args) -> dict[str, list[str]] | None:
    """The matrix's declared releases per axis (verl and each engine), read once; None without a
    matrix to read (a pick-only install, a missing file)."""
    try:
        from .matrix import matrix_from_args

        m = matrix_from_args(args)
    except (ImportError, EnvbuildError, OSError):
        return None
    return {"verl": list(m.verl), **{k: list(v or []) for k, v in m.engines.items()}}


def _release(declared: dict | None, axis: str | None, want: str | None) -> str | None:
    """A selector's version as every command reads it (selector.release_of over the matrix's
    declared releases): `--vllm 0.8.5` means 0.8.5.post1 where that is the matrix's one 0.8.5, as
    lock and build read it; a version the matrix does not declare is expected as given."""
    if not want or not axis or declared is None:
        return want
    from .selector import release_of

    return release_of(want, declared.get(axis) or [], f"--{axis}", undeclared=True)[0]


def _expect(args, sel) -> dict:
    declared = _declared(args) if (sel.engine_version and not args.expect_engine_version) or \
        (sel.verl and not args.expect_verl) else None
    cuda = args.expect_cuda or sel.cuda
    if cuda:
        var = parse_variant(cuda)
        if var is None:
            raise InputError("command line", None, "--expect-cuda", cuda, "not a variant (cu124 or 12.4, rocm6.2, or cpu)")
        cuda = var.tag
    expect = {"cuda": cuda, "torch": args.expect_torch or sel.torch,
              "engine_version": args.expect_engine_version or _release(declared, sel.engine, sel.engine_version),
              "verl": args.expect_verl or _release(declared, "verl", sel.verl),
              "platform": sel.platform}  # --platform: an image of another machine runs emulated
    return {k: v for k, v in expect.items() if v}


def run(args) -> int:
    if getattr(args, "ray", None):
        return run_from_args(args)
    if not args.image and not args.here:
        raise UsageError("what to probe: give an IMAGE to probe in a container, --here to probe this Python "
                         "environment, or --ray ADDRESS with selectors (see envbuild probe --help)")
    if args.image and args.here:
        raise UsageError(f"give IMAGE ({args.image}) or --here, not both")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout={args.timeout}: must be > 0")
    if args.python_exe and not args.here:
        raise UsageError("--python-exe goes with --here")
    if args.python_exe and not shutil.which(args.python_exe):
        raise UsageError(f"--python-exe={args.python_exe!r}: no such interpreter")
    if args.python_exe and os.sep in args.python_exe:
        # relative to where the user stands, not to the folder the probe runs in (it ran in /)
        args.python_exe = os.path.abspath(args.python_exe)
    if args.nproc < 1:
        raise UsageError(f"--nproc={args.nproc}: must be >= 1")
    sel = selectors_from_args(args)
    row = read_row(args.python_exe) if args.here and args.python_exe else None
    if args.here and args.results and row is None:
        raise UsageError("--here --results records a row made with `envbuild venv`: pass --python-exe VENV/bin/python")
    if row is not None and not sel.engine:  # a materialized row: judge it as the combination it is
        from .probe_exec import expect_of

        engine, expect = row["combo"]["engine"], {**expect_of(row["combo"]), **_expect(args, sel)}
    else:
        engine, expect = sel.engine or DEFAULT_ENGINE, _expect(args, sel)
    if args.here:
        v = probe_here(level=args.level, engine=engine, expect=expect, timeout=args.timeout, nproc=args.nproc,
                       python=args.python_exe)
    else:
        v = probe_image(args.image, level=args.level, engine=engine, expect=expect, timeout=args.timeout,
                        docker=args.docker, nproc=args.nproc)
    if args.output:
        write_json_atomic(args.output, v)
    if args.here and args.results:
        rec = record_in_place(args.results, row, args.level, v, args.python_exe)
        print(f"recorded {rec.combo['id']} in place: {rec.status} -> {args.results}/records/{rec.combo['id']}/"
              f"{rec.run_id}.json", file=sys.stderr)
    if args.json:
        json.dump(v, sys.stdout, indent=2, sort_keys=True, default=str)
        print()
    else:
        print_summary(v)
    return exit_of_verdict(v.get("status"))


def print_summary(v: dict, file=None) -> None:
    file = file or sys.stdout
    for c in v.get("checks", []):
        if c["status"] not in QUIET:
            first = (c.get("detail") or "").strip().splitlines()
            print(f"  {c['status']:<10} {c['name']}: {first[0][:200] if first else ''}", file=file)
    t = v.get("timings", {})
    where = v.get("runner", {}).get("image") or "here"
    print(f"probe {v.get('level')}/{v.get('engine')} [{where}]: {v.get('status')}"
          + (f" ({v.get('cause')})" if v.get("cause") else "")
          + (f", {t['process']:.1f}s" if "process" in t else ""), file=file)
