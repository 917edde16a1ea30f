"""`envbuild build`: plan -> lock -> render -> build (BuildKit) -> push -> probe -> record, for
every planned combination: the command's options, the run's shared bases (resolved once, in the
background from the start: BaseFutures), the manifest lists after a push, and the summary. One
combination's way through the stages, and the rule its record follows, is envbuild.pipeline.

Combinations build concurrently (-j N) and independently: one failing never stops the others.
An image whose content tag already exists locally or in the registry is not rebuilt, which is
also how a rerun after Ctrl-C resumes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

from . import host
from .base import bootstrap, resolve_base
from .docker import detect
from .errors import INTERRUPTED, EnvbuildError, InfraError, InputError
from .image import REPOSITORY_ENV, add_repository_arg, repository_from_args
from .index import Metadata
from .index_config import default_index_url, pytorch_root
from .lock import Locker
from .matrix import matrix_from_args
from .expand import plan_from_args
from .outcome import exit_of_records
from .probe_run import VerdictCache, probe_image_levels
from .background import BaseFutures
from .pipeline import DEFAULT_TIMEOUT, PROBE_CHOICES, Builder, Options, run_all
from .progress import PlainProgress, RichProgress
from .push import COMPRESSIONS, pusher_for
from .record import latest_by_combo
from .render import render_combo
from .selector import add_selector_args
from .values import Base, registry_host
from .probe.hardware import DEFAULT_PLATFORM, host_platform

CA_ENV = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
DEFAULT_RESULTS = "results"

def default_ca_bundle() -> str | None:
    for var in CA_ENV:
        p = os.environ.get(var)
        if p and os.path.isfile(p):
            return p
    return None



# --------------------------------------------------------------------------- adapters


def _lock_adapter(matrix, meta):
    locker = Locker(matrix, meta)
    lk = threading.Lock()

    def fn(combo, out):
        with lk:  # one Locker shares metadata caches; uv itself runs outside our threads' way
            return locker.lock(combo, out)
    return fn


def _render_adapter():
    # render writes OUT/<combo id>/ (Dockerfile, locks, probe) and hashes that whole context.
    return lambda combo, lr, base, out: render_combo(combo, lr, base, out)


def _base_adapter(engine, spec: str, suite: str, say, registry: str | None = None) -> BaseFutures:
    """--base SPEC -> the run's shared bases: one resolution per spec (per CUDA devel image for
    nvidia and auto), and auto's fallback to the bootstrap base made once for all of them."""

    def key(combo) -> str:
        return (spec if spec not in ("nvidia", "auto") else f"{spec}:{combo.base_image}") + f"@{combo.platform}"

    def kw(combo) -> dict:
        # A non-host platform's bootstrap base is served from the build's registry (BuildKit
        # resolves a foreign base only from a registry).
        return {"platform": combo.platform, "registry": registry}

    def resolve(combo) -> Base:
        if spec == "auto":
            # The CUDA devel image when this engine has or can pull it; else the
            # air-gapped path (bootstrap), said out loud and recorded.
            ref = combo.base_image
            if ref and (engine.image_exists(ref) or _try_pull(engine, ref)):
                return resolve_base(engine, "nvidia", combo, suite=suite, log=say, **kw(combo))
            say(f"base: {ref or 'nvidia image'} cannot be pulled here; using the bootstrap base")
            return bases.shared(f"bootstrap@{combo.platform}",
                                lambda: bootstrap(engine, suite=suite, log=say, **kw(combo)))
        return resolve_base(engine, spec, combo, suite=suite, log=say, **kw(combo))

    bases = BaseFutures(resolve, key)
    return bases


def _try_pull(engine, ref: str) -> bool:
    try:
        engine.pull(ref, timeout=1800)
        return True
    except (InfraError, Exception):  # noqa: BLE001 - any pull failure means: not available
        return False


# --------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("-j", "--jobs", type=int, default=1, help="combinations built at once (default 1)")
    add_repository_arg(p)
    p.add_argument("--push", action="store_true", help="push images to --repository and record their digests")
    p.add_argument("--base", default="auto",
                   help="nvidia (the matrix's CUDA devel image) | bootstrap (debootstrap base) | an image; "
                        "default auto: nvidia when it can be pulled, else bootstrap")
    p.add_argument("--suite", default="bookworm", help="distribution suite for --base bootstrap")
    p.add_argument("--probe", default="none", choices=PROBE_CHOICES, help="probe each image (default none)")
    p.add_argument("--dry-run", action="store_true", help="print what would be built, with size and time, and stop")
    p.add_argument("-y", "--yes", action="store_true",
                   help=f"build more than {CONFIRM_ABOVE} combinations without asking")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results folder (default ./{DEFAULT_RESULTS})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per build (default 3600)")
    p.add_argument("--ca-bundle", help="CA bundle given to builds as a secret (default: $PIP_CERT, "
                                       "$SSL_CERT_FILE or $REQUESTS_CA_BUNDLE)")
    p.add_argument("--rebuild", action="store_true", help="build even when the content tag exists")
    p.add_argument("--json", action="store_true", help="print the records as JSON (progress goes to stderr)")
    p.add_argument("--reprobe", action="store_true",
                   help="probe even when this image content was already probed by this probe version")
    p.add_argument("--no-cache", action="store_true",
                   help="ignore BuildKit's layer cache: a cold build (BuildKit then gives the steps fresh cache "
                        "mounts too: uv downloads again and every .pyc is compiled again; on Docker Engine 20.10, "
                        "layers the engine already held are left on disk a second time, which neither image rm nor "
                        "builder prune frees: ~8 GB per vLLM image)")
    p.add_argument("--compression", default="auto", choices=COMPRESSIONS,
                   help="pushed layers: auto (default: none to a registry on this machine, zstd elsewhere), "
                        "none, zstd (OCI media types, every core; needs the zstd program) or gzip (docker push)")


# Combinations one `build` starts without --yes (or a yes on a terminal): one image is ~9 GB and
# minutes of a machine, so a selection that plans more (the headline `--vllm 0.8.4 --cuda cu126`
# plans three, one per verl) is said in numbers first.
CONFIRM_ABOVE = 1
# What one image costs, cold, from bench/quickstart.json and bench/build_speed.json (8.6 GB
# uncompressed, 6 min on a quiet 2-core machine, 13 under load); combinations sharing torch cost far less.
IMAGE_GB, IMAGE_MIN = 8.6, 8


def preview(combos) -> str:
    return (f"{len(combos)} image(s), up to ~{len(combos) * IMAGE_GB:.0f} GB of disk and ~{len(combos) * IMAGE_MIN} min "
            "cold (combinations that share torch and the engine reuse those layers)")


def confirm(combos, args, out) -> bool:
    """More than one combination: --yes, or a yes on a terminal; never a silent 26 GB build."""
    if len(combos) <= CONFIRM_ABOVE or args.yes:
        return True
    if sys.stdin.isatty():
        print(f"envbuild build: {preview(combos)}. Build them? [y/N] ", end="", file=out, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    raise InputError("command line", None, "selectors", f"{len(combos)} combinations",
                     f"would build {preview(combos)}; pass --yes, narrow the selection, or --dry-run to list them")


def options_from_args(args, default_repo: str, matrix_pytorch_index: str | None = None) -> Options:
    if args.jobs < 1:
        raise InputError("command line", None, "--jobs", args.jobs, "must be at least 1")
    if args.timeout <= 0:
        raise InputError("command line", None, "--timeout", args.timeout, "must be positive")
    repo, in_registry = repository_from_args(args, default_repo, lambda t: print(f"warning: {t}", file=sys.stderr))
    if args.push and not in_registry:
        raise InputError("command line", None, "--push", True, f"needs --repository (or ${REPOSITORY_ENV})")
    ca = args.ca_bundle
    if ca is not None and not os.path.isfile(ca):
        raise InputError("command line", None, "--ca-bundle", ca, "no such file")
    ca = os.path.abspath(ca) if ca else default_ca_bundle()
    return Options(results=Path(args.results).resolve(), repo=repo, in_registry=in_registry, push=args.push,
                   base=args.base, suite=args.suite, probe=args.probe, jobs=args.jobs, timeout=args.timeout,
                   ca_bundle=ca, index_url=default_index_url(),
                   torch_index_root=pytorch_root(matrix_pytorch_index), rebuild=args.rebuild,
                   no_cache=args.no_cache, compression=args.compression)


def _probe_level(spec: str) -> str:
    if spec != "auto":
        return spec
    return "gpu" if host.gpu_present() else "cpu"


def run(args) -> int:
    meta = Metadata()
    if getattr(args, "platform", None) is None:
        # Images for this machine unless another platform is named (those build under qemu, and
        # need ci/emulation.sh and a registry): plan and lock show every platform, build does not.
        args.platform = host_platform() or DEFAULT_PLATFORM
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    if getattr(args, "dry_run", False):
        if getattr(args, "json", False):
            print(json.dumps({"combinations": [c.to_dict() for c in pl.combos], "images": len(pl.combos),
                              "disk_gb_up_to": len(pl.combos) * IMAGE_GB, "minutes_cold_up_to": len(pl.combos) * IMAGE_MIN},
                             indent=2, sort_keys=True))
            return 0
        print(f"envbuild build --dry-run: {preview(pl.combos)}:")
        for c in pl.combos:
            print(f"  {c.id}")
        return 0
    if not confirm(pl.combos, args, sys.stderr):
        print("envbuild build: nothing built", file=sys.stderr)
        return 0
    opts = options_from_args(args, m.repository, m.pytorch_index)
    opts.probe = _probe_level(opts.probe)
    engine = detect()
    if opts.push:
        pusher_for(engine, opts.compression, opts.repo)  # no zstd program here: say so before building
    opts.results.mkdir(parents=True, exist_ok=True)
    # --json: the result on stdout, progress on stderr (a live table only on a terminal)
    out = sys.stderr if args.json else sys.stdout
    prog_cls = RichProgress if out.isatty() else PlainProgress
    stop = threading.Event()
    # A kill (SIGTERM) takes the same path as Ctrl-C: running builds are stopped, records kept.
    def _term(signum, frame):
        raise KeyboardInterrupt
    old_term = signal.signal(signal.SIGTERM, _term)
    with prog_cls(pl.combos, stream=out) as prog:
        prog.message(f"envbuild build: {len(pl.combos)} combination(s), -j {opts.jobs}, {engine.describe()}")
        builder = Builder(opts, engine, lock_fn=_lock_adapter(m, meta), render_fn=_render_adapter(),
                          base_fn=_base_adapter(engine, opts.base, opts.suite, prog.message,
                                                registry_host(opts.repo)),
                          probe_fn=probe_image_levels, progress=prog, stop=stop,
                          verdict_cache=None if args.reprobe else VerdictCache())
        for c in pl.combos:
            prog.update(c.id, "queued")
        try:
            records, interrupted = run_all(builder, pl.combos, opts.jobs)
            # A base still resolving (every lock failed first, or Ctrl-C): let it finish, so no
            # debootstrap is left behind half done (its own cleanup runs); a second Ctrl-C leaves.
            if builder.base_fn.running():
                prog.message("waiting for the base resolution started at the beginning of the run")
                try:
                    builder.base_fn.wait()
                except KeyboardInterrupt:
                    interrupted = True
        finally:
            signal.signal(signal.SIGTERM, old_term)
    if opts.push and not interrupted:
        write_indexes(opts, say=lambda t: print(t, file=out))
    rc = summarize(records, opts, interrupted, len(pl.combos), out=out)
    if args.json:
        json.dump([{"id": r.combo["id"], "status": r.status, "stage": r.stage, "cause": r.cause,
                    "image": r.image, "run_id": r.run_id, "notes": r.lock_notes,
                    "levels": {lv: v.status for lv, v in r.probe.items()}}
                   for r in sorted(records, key=lambda r: r.combo["id"])], sys.stdout, indent=2, sort_keys=True)
        print()
    return rc


def write_indexes(opts: Options, say=print) -> dict[str, str]:
    """One multi-platform manifest list per plain tag whose platforms were pushed (from the latest
    record of each image in the results, so an arm64 run joins an earlier amd64 one). A tag with one
    platform keeps that image's own manifest. A registry refusal is said, not fatal: every
    platform's image stays pullable by its own tag and digest, which is what the table pins."""
    from .manifest import group_for_indexes, push_index  # oras is loaded only when pushing

    out = {}
    for ref, children in group_for_indexes(latest_by_combo(opts.results).values()).items():
        if len(children) < 2:
            continue
        try:
            out[ref] = push_index(ref, children)
            say(f"manifest list {ref}: {', '.join(sorted(children))} -> {out[ref]}")
        except EnvbuildError as e:
            say(f"manifest list {ref}: not written: {e}")
    return out


def summarize(records, opts: Options, interrupted: bool, planned: int, out=None) -> int:
    out = out or sys.stdout
    print(f"\n{'combination':<50} {'status':<7} {'stage':<7} {'cause / image'}", file=out)
    for r in sorted(records, key=lambda r: r.combo["id"]):
        img = r.image or {}
        what = r.cause or (img.get("digest") or img.get("ref") or "")
        print(f"{r.combo['id']:<50} {r.status:<7} {r.stage:<7} {what}", file=out)
        if r.status != "ok" and r.detail:
            first = r.detail.strip().splitlines()
            print(f"{'':<50} {first[0][:300] if first else ''}", file=out)
    images = sorted({(r.image or {}).get("ref") for r in records if r.status == "ok" and r.image})
    print(f"\nimages: {opts.repo} ({len(images)} built or reused" +
          (", pushed" if opts.push else ", local") + ")", file=out)
    for i in images:
        print(f"  {i}", file=out)
    print(f"results: {opts.results / 'records'} (logs: {opts.results / 'logs'})", file=out)
    missing = ([] if opts.probe != "none" else ["--probe cpu"]) + \
        ([] if opts.push else ["--push --repository HOST:PORT"])
    if images and missing:
        # `pick` answers only images that were probed and pushed (a digest): say so now, not at pick time.
        print(f"not pickable yet: `envbuild pick` needs a probed image with a registry digest; build again with "
              f"{' '.join(missing)} (then `envbuild publish`)", file=out)
    if interrupted:
        print(f"interrupted: {len(records)} of {planned} recorded; rerun the same command to resume", file=out)
        return INTERRUPTED
    return exit_of_records(r.status for r in records)
