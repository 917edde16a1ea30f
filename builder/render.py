"""`envbuild render`: one Dockerfile (and its build context) per combination.

The context holds the Dockerfile, the layer locks, the secrets helper and a copy of the
probe. Output is deterministic: the same combination, lock and base give the same bytes, and
the content hash over the whole context names the image (an image whose hash exists is not
rebuilt).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvbuildError
from .fsutil import write_atomic
from .lock import LockResult
from .matrix import Combo
from .paths import templates_dir

LABEL_PREFIX = "io.envbuild."
PROBE_DIR = "envbuild_probe"  # the probe's package name inside images
SECRETS = ("ca-bundle", "index-url", "torch-index-url")
LAYER_TITLES = {
    "engine": "The rollout engine: shared by every combination with this torch and engine.",
    "verl": "verl itself: the most volatile layer.",
}


@dataclass(frozen=True)
class Base:
    kind: str  # nvidia | bootstrap | image
    ref: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "ref": self.ref}


@dataclass
class Rendered:
    combo: Combo
    context_dir: Path
    dockerfile: Path
    content_hash: str
    secrets: tuple[str, ...] = SECRETS
    base: Base | None = None


def labels(combo: Combo, lock: LockResult, base: Base) -> list[tuple[str, str]]:
    vals = {"verl": combo.verl, "engine": combo.engine, "engine-version": combo.engine_version,
            "torch": combo.torch, "cuda": combo.cuda, "python": combo.python, "combo": combo.id,
            "lock-hash": lock.lock_hash or "", "era": lock.era, "base-kind": base.kind,
            "torch-index": lock.torch_index}
    return [(LABEL_PREFIX + k, v) for k, v in vals.items()]


def _probe_src() -> Path:
    return Path(__file__).resolve().parent / "probe"


def render_dockerfile(combo: Combo, lock: LockResult, base: Base) -> str:
    import jinja2

    if not lock.ok:
        raise EnvbuildError(f"{combo.id}: cannot render without a lock ({lock.status})")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=False,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    layers = [{"name": l.name, "title": LAYER_TITLES.get(l.name, l.name)} for l in lock.layers]
    return env.get_template("Dockerfile.j2").render(combo=combo, lock=lock, base=base, layers=layers,
                                                     labels=labels(combo, lock, base))


def context_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def render_combo(combo: Combo, lock: LockResult, base: Base, out_dir: str | Path) -> Rendered:
    d = Path(out_dir) / combo.id
    text = render_dockerfile(combo, lock, base)
    files: dict[str, bytes] = {"Dockerfile": text.encode(),
                               "envbuild/secrets-env.sh": (templates_dir() / "secrets-env.sh").read_bytes(),
                               "locks/tools.txt": lock.tools.encode()}
    for l in lock.layers:
        files[f"locks/{l.name}.txt"] = Path(l.path).read_bytes() if Path(l.path).is_file() else l.path.encode()
    for p in sorted(_probe_src().rglob("*.py")):
        if "__pycache__" not in p.parts:
            files[f"{PROBE_DIR}/{p.relative_to(_probe_src())}"] = p.read_bytes()
    # Replace the whole context so no stale file from an earlier render changes the hash.
    if d.exists():
        shutil.rmtree(d)
    for rel, data in files.items():
        write_atomic(d / rel, data)
    h = context_hash(d)
    write_atomic(d.parent / f"{combo.id}.json", json.dumps(
        {"combo": combo.to_dict(), "content_hash": h, "base": base.to_dict(), "lock_hash": lock.lock_hash},
        indent=2, sort_keys=True) + "\n")
    return Rendered(combo, d, d / "Dockerfile", h, SECRETS, base)


def base_for(combo: Combo, choice: str, bootstrap_ref: str | None = None) -> Base:
    """--base nvidia | bootstrap | IMAGE -> the base image of a combination."""
    if choice == "nvidia":
        return Base("nvidia", combo.base_image)
    if choice == "bootstrap":
        if not bootstrap_ref:
            raise EnvbuildError("--base bootstrap needs a bootstrapped base: run `envbuild base bootstrap`")
        return Base("bootstrap", bootstrap_ref)
    from .matrix import IMAGE_RE

    if not IMAGE_RE.match(choice):
        raise EnvbuildError(f"--base={choice!r}: not nvidia, bootstrap or an image reference")
    return Base("image", choice)


def add_arguments(p) -> None:
    from .matrix import add_selector_args

    add_selector_args(p)
    p.add_argument("--out", default="rendered", help="output folder (default: ./rendered)")
    p.add_argument("--locks", default="locks", help="where lock files go (default: ./locks)")
    p.add_argument("--base", default="nvidia", help="nvidia (default) | bootstrap | IMAGE")
    p.add_argument("--base-ref", default=None, help="the image for --base bootstrap (default: detect)")


def run(args) -> int:
    from .index import Metadata
    from .lock import Locker
    from .matrix import matrix_from_args
    from .plan import plan_from_args

    meta = Metadata()
    m = matrix_from_args(args)
    locker = Locker(m, meta)
    rc = 0
    for c in plan_from_args(args, meta).combos:
        lock = locker.lock(c, args.locks)
        if not lock.ok:
            print(f"{c.id}: not rendered: {lock.status}: {' '.join(lock.detail.split())[:400]}")
            rc = max(rc, 3 if lock.status in ("index-unreachable", "lock-error") else 1)
            continue
        ref = args.base_ref
        if args.base == "bootstrap" and not ref:
            try:
                from .base import default_bootstrap_ref

                ref = default_bootstrap_ref()
            except ImportError:
                ref = None
        r = render_combo(c, lock, base_for(c, args.base, ref), args.out)
        print(f"{c.id}: {r.dockerfile} (content {r.content_hash[:12]})")
    return rc
