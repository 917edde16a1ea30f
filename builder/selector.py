"""One selector grammar for every command that selects combinations (plan, lock, render, build,
probe --ray, ci, pick).

Flags: --cuda (cu126 or 12.6: any spelling of an accelerator variant), --platform linux/arm64 (or
arm64), --python 3.N, --torch V, --engine NAME with one shortcut per engine (vocab.ENGINE_SPECS:
--vllm V, --sglang V for versioned engines, --hf for an unversioned one), --verl V, --matrix FILE.

A version selects by release prefix: `--vllm 0.8` selects 0.8.4 and 0.8.5.post1; `--vllm 0.8.5`
selects 0.8.5 only (not 0.8.5.post1: same number of release segments means exact). An engine or
verl version the matrix does not declare is refused with the nearest declared ones, except that a
release whose only declared candidate is its post-release means that one (`--vllm 0.8.5` plans
0.8.5.post1, and the plan says so); `--undeclared` plans a version as given. `--torch` overrides
the pin the engine implies and is planned as given (so `--torch 2.7.0 --vllm 0.8.4` is judged);
pick only filters.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import lru_cache

from packaging.version import InvalidVersion, Version

from .errors import InputError
from .probe.vocab import ENGINES, ENGINE_SPECS
from .probe.hardware import DEFAULT_PLATFORM, PLATFORMS, parse_platform, parse_variant, variant_tag

_PY_RE = re.compile(r"3\.\d{1,2}")
_WHERE = "command line"


@dataclass(frozen=True)
class Selectors:
    cuda: str | None = None  # an accelerator variant's tag: cu126 (hardware.Variant)
    python: str | None = None
    torch: str | None = None
    engine: str | None = None  # vllm | sglang | hf
    engine_version: str | None = None
    verl: str | None = None
    platform: str | None = None  # linux/amd64 | linux/arm64 (hardware.parse_platform)

    def any(self) -> bool:
        return any(v for v in asdict(self).values())

    def explicit(self) -> bool:
        """Names one verl release and one engine release: the user asks about exactly that stack."""
        return bool(self.verl and self.engine and (self.engine_version or not _versioned(self.engine)))

    def matches(self, *, cuda=None, python=None, torch=None, engine=None, engine_version=None, verl=None,
                platform=None) -> bool:
        if self.cuda and variant_tag(cuda) != self.cuda:
            return False
        if self.platform and (parse_platform(platform) or DEFAULT_PLATFORM) != self.platform:
            return False
        if self.python and str(python) != self.python:
            return False
        if self.engine and engine != self.engine:
            return False
        for want, have in ((self.torch, torch), (self.engine_version, engine_version), (self.verl, verl)):
            if want and not version_matches(want, have):
                return False
        return True

    def matches_combo(self, c) -> bool:
        return self.matches(cuda=c.cuda, python=c.python, torch=c.torch, engine=c.engine,
                            engine_version=c.engine_version, verl=c.verl, platform=c.platform)

    def describe(self) -> str:
        """The selectors as flags, for messages."""
        parts = []
        for k in ("verl", "engine", "engine_version", "torch", "cuda", "python", "platform"):
            v = getattr(self, k)
            if v and k == "engine_version":
                continue
            if v and k == "engine":
                parts.append(f"--{v} {self.engine_version}" if self.engine_version else
                             (f"--{v}" if not _versioned(v) else f"--engine {v}"))
            elif v:
                parts.append(f"--{k} {v}")
        return " ".join(parts) or "(no selectors)"


@lru_cache(maxsize=65536)
def _parse(v: str) -> Version | None:
    try:
        return Version(v)
    except InvalidVersion:
        return None


@lru_cache(maxsize=65536)
def version_matches(want: str, have: object) -> bool:
    """Exact (PEP 440 equality: 2.6 == 2.6.0), or a release prefix with fewer segments."""
    if have is None:
        return False
    w, h = _parse(str(want)), _parse(str(have))
    if w is None or h is None:
        return str(want) == str(have)
    if w == h:
        return True
    plain = w.pre is None and w.post is None and w.dev is None and not w.local
    n = len(w.release)
    return plain and n < len(h.release) and h.release[:n] == w.release


def narrow(want: str | None, declared: list[str]) -> list[str]:
    """The declared values a selector picks; the selector itself when it picks none of them."""
    if not want:
        return list(declared)
    hits = [d for d in declared if version_matches(want, d)]
    return hits or [want]


def release_of(want: str | None, declared: list[str], flag: str, undeclared: bool = False) -> tuple[str | None, str | None]:
    """The selector a version means among the declared releases: (value, note for the plan).
    A prefix or an exact release stays; a release whose one declared candidate is its
    post-release becomes that; anything else is refused with the nearest declared releases
    unless `undeclared` (then planned as given)."""
    if not want or not declared or any(version_matches(want, d) for d in declared):
        return want, None
    w = _parse(want)
    if w is not None and w.post is None and w.pre is None and w.dev is None:
        posts = [d for d in declared if (h := _parse(d)) is not None and h.post is not None
                 and h.release == w.release and h.pre is None and h.dev is None]
        if len(posts) == 1:
            return posts[0], f"{flag} {want} means {posts[0]}, the matrix's only release of {want}"
    if undeclared:
        return want, f"{flag} {want} is not a release the matrix declares: planned as given (--undeclared)"
    raise InputError(_WHERE, None, flag, want, "not a release the matrix declares (nearest: "
                     + ", ".join(nearest(want, declared)) + "); --undeclared plans it as given")


def nearest(want: str, declared: list[str], n: int = 2) -> list[str]:
    """Up to n declared versions on each side of `want`, in order."""
    known = sorted({d for d in declared if _parse(d) is not None}, key=_parse)
    w = _parse(want)
    if w is None:
        return known[-2 * n:]
    i = sum(1 for d in known if _parse(d) < w)
    return known[max(0, i - n):i + n]


def add_selector_args(p, *, matrix: bool = True) -> None:
    if matrix:  # commands that read a table instead (pick) select without one
        p.add_argument("--matrix", default=None, help="matrix YAML (default: the bundled matrix/verl.yaml)")
        p.add_argument("--undeclared", action="store_true",
                       help="plan an engine or verl version the matrix does not declare, as given")
    p.add_argument("--cuda", help="CUDA variant: cu126 or 12.6")
    p.add_argument("--python", help="Python version, e.g. 3.11")
    p.add_argument("--platform", help=f"platform: {' or '.join(PLATFORMS)} (arm64 and amd64 work too)")
    p.add_argument("--torch", help="torch version or prefix (overrides the pin the engine implies)")
    p.add_argument("--engine", choices=ENGINES,
                   help="engine; " + " / ".join(_flag(e) for e in ENGINE_SPECS) + " are shortcuts")
    for e in ENGINE_SPECS:  # one shortcut per engine, from its descriptor
        if e.versioned:
            p.add_argument(f"--{e.name}", metavar="V", help=f"{e.label} version or prefix (0.8 selects 0.8.x)")
        else:
            p.add_argument(f"--{e.name}", action="store_true", help=f"the {e.label} engine")
    p.add_argument("--verl", metavar="V", help="verl version or prefix")


def _flag(e) -> str:
    return f"--{e.name} V" if e.versioned else f"--{e.name}"


def _versioned(engine: str) -> bool:
    return next((e.versioned for e in ENGINE_SPECS if e.name == engine), True)


def _version(flag: str, v: str | None) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > 64 or _parse(v) is None or not re.fullmatch(r"[0-9A-Za-z.!+-]+", v):
        raise InputError(_WHERE, None, flag, v, "not a PEP 440 version (e.g. 0.8.4, or 0.8 for every 0.8.x)")
    return v


def selectors_from_args(args) -> Selectors:
    g = lambda k: getattr(args, k, None)  # noqa: E731 - not every command has every flag
    cuda = g("cuda")
    if cuda is not None:
        var = parse_variant(cuda)
        if var is None or var.kind == "cpu":
            raise InputError(_WHERE, None, "--cuda", cuda, "not an accelerator variant (cu126 or 12.6, rocm6.2)")
        cuda = var.tag
    platform = g("platform")
    if platform is not None:
        norm = parse_platform(platform)
        if norm is None:
            raise InputError(_WHERE, None, "--platform", platform, f"not a platform ({', '.join(PLATFORMS)})")
        platform = norm
    python = g("python")
    if python is not None and not _PY_RE.fullmatch(python):
        raise InputError(_WHERE, None, "--python", python, "not a Python version 3.N")
    shortcuts = [(e.name, g(e.name) if e.versioned else "") for e in ENGINE_SPECS if g(e.name)]
    if len(shortcuts) > 1:
        raise InputError(_WHERE, None, "/".join(f"--{e}" for e in ENGINES), " ".join(f"--{e}" for e, _ in shortcuts),
                         "pick one engine")
    engine, ev = g("engine"), None
    if shortcuts:
        e, ev = shortcuts[0]
        if engine and engine != e:
            raise InputError(_WHERE, None, "--engine", engine, f"conflicts with --{e}")
        engine = e
    return Selectors(cuda=cuda, python=python, torch=_version("--torch", g("torch")), engine=engine,
                     engine_version=_version(f"--{engine}", ev) if ev else None,
                     verl=_version("--verl", g("verl")), platform=platform)


def from_flags(**flags) -> Selectors:
    """Selectors from flag values by name (cuda=, engine=, one per engine shortcut: vllm=, hf=, ...,
    torch=, verl=, python=, platform=), validated as on the command line."""
    from types import SimpleNamespace

    return selectors_from_args(SimpleNamespace(**flags))
