"""The matrix: the YAML that declares axes, includes and excludes, read into a `Matrix`
(envbuild.expand turns it into the plan).

The YAML is validated node by node so every error names the file, the line and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from packaging.version import InvalidVersion, Version

from . import yamlsafe
from .errors import InputError
from .paths import default_matrix
from .values import IMAGE_RE, VariantEntry
from .probe.vocab import ENGINE, ENGINES, VERSIONED_ENGINES
from .probe.hardware import DEFAULT_PLATFORM, PLATFORMS, parse_variant, variant_of

# Field patterns, used with fullmatch. They end in \Z, not $ ($ also matches before a trailing
# newline, which then reaches Dockerfiles, lock headers and directory names), so a stray
# .match() is safe too; re.ASCII so \d and \w do not accept other scripts' digits and letters.
SAFE_STR_RE = re.compile(r"[A-Za-z0-9_.,:/@=<>!~*+ -]*\Z")
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}\Z", re.ASCII)
# The characters of a PEP 440 version (parsed by packaging afterwards, which would also accept
# surrounding whitespace); 64 characters bound every name built from it (tags, cache files).
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.!+_-]{0,63}\Z")
TOOLKIT_RE = re.compile(r"\d{1,2}\.\d{1,2}\Z", re.ASCII)
GLIBC_RE = re.compile(r"2\.\d{1,3}\Z", re.ASCII)
PYTHON_RE = re.compile(r"3\.\d{1,2}\Z", re.ASCII)
PLATFORM_RE = re.compile("(?:" + "|".join(PLATFORMS) + r")\Z")
ENGINE_RE = re.compile("(?:" + "|".join(ENGINES) + r")\Z")
MAX_STR = 256  # any other string field (specifiers, reasons, image references)
# A matrix is a few KB; these bounds stop hostile YAML long before it costs time or memory.
MATRIX_MAX_BYTES, MATRIX_MAX_DEPTH, MATRIX_MAX_NODES = 256 * 1024, 16, 5_000
# Axes multiply: 5,000 nodes could ask for 10^7 combinations. Planning 10^5 takes ~1 s
# (bench/plan_speed.py); twice that is the most a matrix may expand to.
MAX_RAW_COMBINATIONS = 200_000


# --------------------------------------------------------------------------- data classes


@dataclass(frozen=True)
class ExcludeRule:
    match: dict[str, str]  # axis -> specifier (versions) or exact value (cuda, engine)
    reason: str
    line: int


@dataclass
class Matrix:
    path: str
    repository: str  # where images go, without a registry: envbuild/verl (image.repository_from_args)
    grace_days: int
    python: list[str]
    cuda: dict[str, VariantEntry]
    torch: list[str] | None  # None = auto (from the engine's pin)
    engines: dict[str, list[str]]
    verl: list[str]
    include: list[dict[str, str]]
    exclude: list[ExcludeRule]
    lines: dict[tuple, int] = field(default_factory=dict, repr=False)
    pytorch_index: str | None = None  # a mirror of the PyTorch index (root of cu126/, ...)
    platforms: list[str] = field(default_factory=lambda: [DEFAULT_PLATFORM])

    def releases(self, axis: str) -> list[str]:
        """The releases the matrix declares for `verl` or a versioned engine: its axis and what its
        includes name (selectors, completion and the recorded metadata all ask here)."""
        axis_values = self.verl if axis == "verl" else (self.engines.get(axis) or [])
        return list(dict.fromkeys([*axis_values, *(i[axis] for i in self.include if i.get(axis))]))


# --------------------------------------------------------------------------- YAML loading


class _Checker:
    """Validates one file; every error carries file, line, field, value."""

    def __init__(self, path: str, lines: dict[tuple, int]):
        self.path, self.lines = path, lines

    def fail(self, p: tuple, value: Any, why: str):
        line = None
        for i in range(len(p), -1, -1):
            if p[:i] in self.lines:
                line = self.lines[p[:i]]
                break
        raise InputError(self.path, line, ".".join(map(str, p)) or "top", value, why)

    def mapping(self, v, p, allowed: Iterable[str], required: Iterable[str] = ()) -> dict:
        if not isinstance(v, dict):
            self.fail(p, v, "expected a mapping")
        for k in v:
            if k not in allowed:
                self.fail(p + (k,), k, f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for k in required:
            if k not in v:
                self.fail(p, k, "missing required key")
        return v

    def string(self, v, p, rx: re.Pattern | None = None, what: str = "") -> str:
        if not isinstance(v, str):
            hint = " (quote it: YAML reads 0.10 as the number 0.1)" if isinstance(v, (int, float)) else ""
            self.fail(p, v, f"expected a quoted string{hint}")
        if len(v) > MAX_STR:
            self.fail(p, v, f"longer than {MAX_STR} characters")
        if not SAFE_STR_RE.fullmatch(v):
            self.fail(p, v, "contains characters that are not allowed (shell metacharacters, newlines?)")
        if rx is not None and not rx.fullmatch(v):
            self.fail(p, v, f"not {what}")
        return v

    def version(self, v, p) -> str:
        from packaging.version import InvalidVersion, Version

        s = self.string(v, p)
        if not VERSION_RE.fullmatch(s):
            self.fail(p, v, "not a PEP 440 version (at most 64 characters, no spaces)")
        try:
            ver = Version(s)
        except InvalidVersion:
            self.fail(p, v, "not a PEP 440 version")
        if ver.local:
            self.fail(p, v, "local versions (+...) are not allowed: the CUDA variant is the cuda axis")
        return s

    def specifier(self, v, p) -> str:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        s = self.string(v, p)
        try:
            SpecifierSet(s)
        except InvalidSpecifier:
            self.fail(p, v, "not a PEP 440 version specifier")
        return s

    def cuda(self, v, p) -> str:
        s = self.string(v, p)
        var = parse_variant(s)
        if var is None or var.tag != s or var.kind == "cpu":
            self.fail(p, v, "not an accelerator variant tag: cuNNN for CUDA (cu124), rocmX.Y for ROCm (rocm6.2)")
        return s

    def platform(self, v, p) -> str:
        return self.string(v, p, PLATFORM_RE, "a platform: " + ", ".join(PLATFORMS))

    def lst(self, v, p, item: Callable) -> list:
        if not isinstance(v, list) or not v:
            self.fail(p, v, "expected a non-empty list")
        return [item(x, p + (i,)) for i, x in enumerate(v)]

    def unique(self, values: list, p) -> list:
        """A version listed twice (0.8.4 and 0.8.4, or 2.6 and 2.6.0) would plan one combination
        twice and give CI two jobs of one name."""
        seen: dict = {}
        for i, v in enumerate(values):
            try:
                key = Version(v)
            except InvalidVersion:
                key = v
            if key in seen:
                self.fail(p + (i,), v, f"listed twice (also at index {seen[key]})")
            seen[key] = i
        return values

    def optional_list(self, v, p) -> list:
        """An optional list (include, exclude): absent or null is empty; anything else must be a list."""
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(p, v, "expected a list")
        return v


TOP_KEYS = {"schema", "repository", "image", "grace_days", "python", "cuda", "torch", "engines", "verl", "include",
            "exclude", "pytorch_index", "platforms"}
PYTORCH_INDEX_RE = re.compile(r"https?://[A-Za-z0-9._~:/@!&+,=%-]+")
# Axes an include or exclude may name: each versioned engine is an axis of its own (`vllm: 0.8.4`).
AXES = ("cuda", "python", "torch", "engine", *VERSIONED_ENGINES, "verl", "platform")
UNVERSIONED = next(e for e in ENGINES if not ENGINE[e].versioned)  # an include naming no engine


def load_matrix(path: str | Path) -> Matrix:
    path = str(path)
    data, lines = yamlsafe.load(path, max_bytes=MATRIX_MAX_BYTES, max_depth=MATRIX_MAX_DEPTH,
                                max_nodes=MATRIX_MAX_NODES)
    c = _Checker(path, lines)
    if data is None:
        c.fail((), None, "empty matrix")
    c.mapping(data, (), TOP_KEYS, required=("cuda", "python", "engines", "verl"))
    if type(data.get("schema", 1)) is not int or data.get("schema", 1) != 1:
        c.fail(("schema",), data["schema"], "unsupported schema (expected 1)")
    if "image" in data and "repository" in data:  # `image` is the old name of `repository` (one release of grace)
        c.fail(("image",), data["image"], "give `repository` only (`image` is its deprecated name)")
    key = "image" if "image" in data else "repository"
    repository = c.string(data.get(key, "envbuild/verl"), (key,), IMAGE_RE, "an image repository")
    grace = data.get("grace_days", 14)
    if not isinstance(grace, int) or isinstance(grace, bool) or not 0 <= grace <= 365:
        c.fail(("grace_days",), grace, "expected an integer number of days (0-365)")

    cuda: dict[str, VariantEntry] = {}
    c.mapping(data["cuda"], ("cuda",), data["cuda"].keys() if isinstance(data["cuda"], dict) else ())
    for name, spec in data["cuda"].items():
        p = ("cuda", name)
        c.cuda(name, p)
        c.mapping(spec, p, {"toolkit", "base", "glibc", "torch"}, required=("toolkit", "base", "glibc", "torch"))
        cuda[name] = VariantEntry(
            name=name,
            toolkit=c.string(spec["toolkit"], p + ("toolkit",), TOOLKIT_RE, "MAJOR.MINOR"),
            base=c.string(spec["base"], p + ("base",), IMAGE_RE, "an image reference"),
            glibc=c.string(spec["glibc"], p + ("glibc",), GLIBC_RE, "a glibc version 2.N"),
            torch=c.specifier(spec["torch"], p + ("torch",)),
        )
        if variant_of(parse_variant(name).kind, spec["toolkit"]) != parse_variant(name):
            c.fail(p + ("toolkit",), spec["toolkit"], f"does not match the variant name {name}")

    python = c.unique(c.lst(data["python"], ("python",), lambda v, p: c.string(v, p, PYTHON_RE, "a Python version 3.N")),
                      ("python",))
    platforms = c.lst(data.get("platforms", [DEFAULT_PLATFORM]), ("platforms",), c.platform)
    if len(set(platforms)) != len(platforms):
        c.fail(("platforms",), platforms, "lists a platform twice")
    torch_axis = data.get("torch", "auto")
    torch = None if torch_axis == "auto" else c.unique(c.lst(torch_axis, ("torch",), c.version), ("torch",))

    c.mapping(data["engines"], ("engines",), ENGINES)
    engines: dict[str, list[str]] = {}
    for eng, versions in data["engines"].items():
        if not ENGINE[eng].versioned:
            if not (versions is True or versions is None or versions == []):
                c.fail(("engines", eng), versions, f"{eng} takes no versions: write `{eng}: true`")
            engines[eng] = [""]
        else:
            engines[eng] = c.unique(c.lst(versions, ("engines", eng), c.version), ("engines", eng))
    verl = c.unique(c.lst(data["verl"], ("verl",), c.version), ("verl",))

    def axis_value(k, v, p):
        if k == "cuda":
            return c.cuda(v, p)
        if k == "engine":
            return c.string(v, p, ENGINE_RE, "an engine: " + ", ".join(ENGINES))
        if k == "python":
            return c.string(v, p, PYTHON_RE, "a Python version 3.N")
        if k == "platform":
            return c.platform(v, p)
        return c.version(v, p)

    include = []
    for i, inc in enumerate(c.optional_list(data.get("include"), ("include",))):
        p = ("include", i)
        c.mapping(inc, p, set(AXES) | {"reason"}, required=("verl",))
        d = {k: axis_value(k, v, p + (k,)) for k, v in inc.items() if k != "reason"}
        if "reason" in inc:
            # A reason makes the include a decision: it is planned although an exclude rule (an
            # opinion about which pairs to build) would drop it, and the reason travels as its note.
            d["reason"] = c.string(inc["reason"], p + ("reason",))
            if not d["reason"].strip():
                c.fail(p + ("reason",), inc["reason"], "an empty reason: say why the row is included")
        if sum(k in d for k in VERSIONED_ENGINES) > 1 or ("engine" in d and (set(VERSIONED_ENGINES) & d.keys())):
            c.fail(p, inc, "name exactly one engine: " + ", ".join(VERSIONED_ENGINES) + f" or engine: {UNVERSIONED}")
        if d.get("engine") in VERSIONED_ENGINES:
            c.fail(p + ("engine",), d["engine"], f"an engine needs its version: write `{d['engine']}: X.Y.Z`")
        if "cuda" in d and d["cuda"] not in cuda:
            c.fail(p + ("cuda",), d["cuda"], f"unknown CUDA variant (the matrix declares {', '.join(cuda)})")
        if "platform" in d and d["platform"] not in platforms:
            c.fail(p + ("platform",), d["platform"], f"not a platform of this matrix (it declares {', '.join(platforms)})")
        include.append(d)

    raw = ((len(verl) * sum(map(len, engines.values())) + len(include)) * len(cuda) * len(python) * len(torch or [1])
           * len(platforms))
    if raw > MAX_RAW_COMBINATIONS:
        c.fail((), raw, f"the axes expand to {raw} combinations, more than {MAX_RAW_COMBINATIONS}: split the matrix")

    exclude = []
    for i, ex in enumerate(c.optional_list(data.get("exclude"), ("exclude",))):
        p = ("exclude", i)
        c.mapping(ex, p, set(AXES) | {"reason"}, required=("reason",))
        reason = c.string(ex["reason"], p + ("reason",))
        if not reason.strip():
            c.fail(p + ("reason",), reason, "every exclusion needs a reason")
        match = {}
        for k, v in ex.items():
            if k == "reason":
                continue
            if k in ("cuda", "engine", "python", "platform"):
                match[k] = axis_value(k, v, p + (k,))
            else:
                match[k] = c.specifier(v, p + (k,))
        if not match:
            c.fail(p, ex, "an exclusion must match at least one axis")
        exclude.append(ExcludeRule(match, reason, lines.get(p, 0)))

    pt = data.get("pytorch_index")
    pt = None if pt is None else c.string(pt, ("pytorch_index",), PYTORCH_INDEX_RE, "an http(s) URL")

    if "image" in data:  # warned only for a matrix that loads: a bad one gets its one error line
        import sys
        print(f"warning: {path}:{lines.get(('image',))}: `image:` is deprecated, write `repository:`", file=sys.stderr)
    return Matrix(path, repository, grace, python, cuda, torch, engines, verl, include, exclude, lines, pytorch_index=pt,
                  platforms=platforms)


def matrix_from_args(args) -> Matrix:
    return load_matrix(args.matrix or default_matrix())
