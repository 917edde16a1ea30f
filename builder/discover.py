"""`envbuild discover`: upstream releases newer than the matrix knows, as a patch to it.

Asks the configured package index (envbuild.index.Metadata) for the releases of verl, vLLM,
SGLang and torch. For each engine release newer than the newest one in the matrix, its own
pins decide the rest: its torch pin, and through that the CUDA variants of the matrix whose
torch specifier admits it. A new verl release brings the engine releases its [vllm]/[sglang]
extras pin. By default one release per torch pin is proposed (the newest of each torch era:
the combinations a new pin makes possible); --all proposes every newer release.

The proposal is a unified diff of the matrix YAML, checked by planning the patched matrix
(so a patch that the matrix's own rules would make useless says so). Printed, written with
--write PATCH, or applied with --apply. A scheduled job turns it into a candidate run.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import EnvbuildError
from .fsutil import write_atomic
from .matrix import load_matrix, matrix_from_args
from .expand import _spec_match, plan
from .probe.vocab import VERSIONED_ENGINES, dist_of
from .index import Metadata

PACKAGES = ("verl", *VERSIONED_ENGINES, "torch")  # an engine's releases: vocab.dist_of names its package


@dataclass
class Proposal:
    package: str  # verl | vllm | sglang | torch
    version: str
    torch: str | None = None  # the torch it pins (engines)
    cuda: list[str] = field(default_factory=list)  # matrix variants whose torch range admits it
    default_cuda: str | None = None  # the variant of that torch on the default index
    why: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class Discovery:
    matrix: str
    newest: dict[str, str]  # package -> newest final release on the index
    known: dict[str, str]  # package -> newest release the matrix knows
    proposals: list[Proposal]
    patch: str
    new_combos: list[dict]
    excluded: list[dict]  # new combinations the matrix's rules exclude, with reasons

    def to_dict(self) -> dict:
        return {"matrix": self.matrix, "newest": self.newest, "known": self.known,
                "proposals": [asdict(p) for p in self.proposals], "new_combos": self.new_combos,
                "excluded": self.excluded, "patch": self.patch}


def _final(versions: list[str]) -> list:
    from packaging.version import Version

    out = []
    for v in versions:
        pv = Version(v)
        if not (pv.is_prerelease or pv.is_devrelease or pv.local):
            out.append(pv)
    return sorted(out)


def _known(m, meta) -> dict[str, list[str]]:
    known = {"verl": list(m.verl), **{e: list(m.engines.get(e, [])) for e in VERSIONED_ENGINES}}
    torches = set(m.torch or [])
    torches |= {inc["torch"] for inc in m.include if "torch" in inc}
    for eng in VERSIONED_ENGINES:
        for v in known[eng]:
            pin = meta.torch_pin(eng, v)
            if pin:
                torches.add(pin)
    known["torch"] = sorted(torches)
    return known


def _cuda_for(m, torch_v: str) -> list[str]:
    return [name for name, cv in m.cuda.items() if _spec_match(cv.torch, torch_v)]


def _engine_from_extra(meta, verl_v: str, engine: str, final: list) -> str | None:
    """The engine release a verl release's [engine] extra asks for: its exact pin, else the
    newest index release inside its range."""
    from packaging.utils import canonicalize_name

    for r in meta.requires("verl", verl_v, (engine,)):  # verl's extra is named after the engine
        if canonicalize_name(r.name) != canonicalize_name(dist_of(engine)) or r.marker is None:
            continue
        pins = [s.version for s in r.specifier if s.operator == "=="]
        if pins:
            return pins[0]
        ok = [v for v in final if r.specifier.contains(v)]
        return str(ok[-1]) if ok else None
    return None


def discover(m, meta, all_releases: bool = False) -> list[Proposal]:
    from packaging.version import Version

    known = _known(m, meta)
    final = {p: _final(meta.versions(dist_of(p))) for p in PACKAGES}
    props: list[Proposal] = []

    def engine_proposal(eng: str, v: str, why: str) -> Proposal:
        pin = meta.torch_pin(eng, v)
        p = Proposal(eng, v, torch=pin, why=why)
        if pin is None:
            p.notes.append(f"{eng} {v} pins no exact torch: planned only with an include naming torch")
            return p
        p.cuda = _cuda_for(m, pin)
        try:
            p.default_cuda = meta.default_cuda(pin)
        except EnvbuildError as e:
            p.notes.append(f"torch {pin}: {e}")
        if not p.cuda:
            p.notes.append(f"no CUDA variant of the matrix admits torch {pin}"
                           + (f" (its default-index build is {p.default_cuda}: add that variant)" if p.default_cuda else ""))
        return p

    # verl first: a new verl release names the engine releases it wants.
    newest_verl = max(map(Version, known["verl"]))
    wanted: dict[str, dict[str, str]] = {e: {} for e in VERSIONED_ENGINES}
    for v in (x for x in final["verl"] if x > newest_verl):
        p = Proposal("verl", str(v), why="newer than the matrix's verl releases")
        for eng in VERSIONED_ENGINES:
            if eng not in m.engines:
                continue
            ev = _engine_from_extra(meta, str(v), eng, final[eng])
            if ev:
                p.notes.append(f"its [{eng}] extra asks for {eng} {ev}")
                if ev not in known[eng]:
                    wanted[eng][ev] = f"asked for by verl {v}'s [{eng}] extra"
        props.append(p)

    for eng in VERSIONED_ENGINES:
        if eng not in m.engines:
            continue
        newest = max(map(Version, known[eng]))
        newer = [v for v in final[eng] if v > newest]
        chosen: dict[str, str] = {}
        if all_releases:
            chosen = {str(v): f"newer than the matrix's {eng} releases" for v in newer}
        else:
            # The newest release of each torch era: what each new pin makes possible.
            by_pin: dict[str | None, Version] = {}
            for v in newer:
                by_pin[meta.torch_pin(eng, str(v))] = v  # ascending: the last one wins
            chosen = {str(v): f"newest {eng} release pinning torch {pin}" for pin, v in by_pin.items()}
        for v, why in wanted[eng].items():
            chosen.setdefault(v, why)
        for v in sorted(chosen, key=Version):
            props.append(engine_proposal(eng, v, chosen[v]))

    # torch: reachable through an engine pin (torch: auto) or added to an explicit torch axis.
    newest_torch = max(map(Version, known["torch"])) if known["torch"] else None
    pinned_by_props = {p.torch for p in props if p.torch}
    for v in (x for x in final["torch"] if newest_torch is None or x > newest_torch):
        p = Proposal("torch", str(v), cuda=_cuda_for(m, str(v)), why="newer than every torch the matrix plans")
        try:
            p.default_cuda = meta.default_cuda(str(v))
        except EnvbuildError as e:
            p.notes.append(str(e))
        if m.torch is None:
            p.notes.append("torch: auto - planned through " + (
                "the proposed engine releases that pin it" if str(v) in pinned_by_props
                else "an engine release that pins it (none yet)"))
        if p.default_cuda and p.default_cuda not in m.cuda:
            p.notes.append(f"its default-index build is {p.default_cuda}, a CUDA variant the matrix lacks")
        props.append(p)
    return props


# ---------------------------------------------------------------- the patch


def _insert_in_list(lines: list[str], m, key: tuple, values: list[str], what: str) -> None:
    """Append quoted values to a YAML list (flow `[...]` or block `- x`), editing text only."""
    if not values:
        return
    n_items = len([k for k in m.lines if len(k) == len(key) + 1 and k[:len(key)] == key])
    key_line = m.lines.get(key)
    if key_line is None:
        raise EnvbuildError(f"{m.path}: cannot find {what} in the YAML to extend")
    i = key_line - 1
    quoted = ", ".join(f'"{v}"' for v in values)
    line = lines[i]
    close = line.find("]")
    if "[" in line and close != -1:  # flow list on one line
        inner = line[line.index("[") + 1:close].strip()
        sep = ", " if inner else ""
        lines[i] = line[:close].rstrip() + sep + quoted + line[close:]
        return
    if n_items:  # block list: after the last item, same indentation
        last = m.lines[key + (n_items - 1,)] - 1
        indent = re.match(r"^(\s*-\s*)", lines[last])
        prefix = indent.group(1) if indent else "  - "
        for j, v in enumerate(values):
            lines.insert(last + 1 + j, f'{prefix}"{v}"\n')
        return
    raise EnvbuildError(f"{m.path}:{key_line}: {what}: a list style this tool cannot extend; edit by hand")


def patch_path(path: str | os.PathLike) -> str:
    """The matrix's path as a patch names it: relative to the git work tree that holds it (what
    `git apply` expects, from any directory of that tree), else to the working directory; never
    absolute (git refuses "a//abs/path"). Outside both: the conventional `matrix/<file>`."""
    p = Path(path).resolve()
    for top in p.parents:
        if (top / ".git").exists():  # a directory, or a file in a worktree/submodule
            return p.relative_to(top).as_posix()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return f"matrix/{p.name}"


def patch_text(m, props: list[Proposal]) -> tuple[str, str]:
    """(new YAML text, unified diff)."""
    text = Path(m.path).read_text()
    lines = text.splitlines(keepends=True)
    add = {p: [] for p in PACKAGES}
    for p in props:
        if p.package in VERSIONED_ENGINES and p.torch and p.cuda:
            add[p.package].append(p.version)
        elif p.package == "verl":
            add["verl"].append(p.version)
        elif p.package == "torch" and m.torch is not None and p.cuda:
            add["torch"].append(p.version)
    # Edit bottom-up so earlier line numbers stay valid.
    edits = [(("verl",), "verl", "verl"), (("torch",), "torch", "torch")] + \
        [(("engines", e), e, f"engines.{e}") for e in VERSIONED_ENGINES]
    for key, pkg, what in sorted(edits, key=lambda e: -(m.lines.get(e[0]) or 0)):
        if add[pkg]:
            _insert_in_list(lines, m, key, add[pkg], what)
    new = "".join(lines)
    rel = patch_path(m.path)
    diff = "".join(difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}"))
    return new, diff


def check_patch(m, new_text: str, meta):
    """Plan the patched matrix: the combinations it adds (and excludes), or a clear error."""
    with tempfile.TemporaryDirectory(prefix="envbuild-discover-") as d:
        path = Path(d) / Path(m.path).name
        path.write_text(new_text)
        m2 = load_matrix(path)
        before = plan(m, meta=meta)
        after = plan(m2, meta=meta)
    old_ids = {c.id for c in before.combos} | {e.combo.id for e in before.excluded}
    new = [c.to_dict() for c in after.combos if c.id not in old_ids]
    excl = [{"id": e.combo.id, "reason": e.reason.replace(str(path), m.path)}
            for e in after.excluded if e.combo.id not in old_ids]
    return new, excl


def run_discovery(m, meta, all_releases: bool = False) -> Discovery:
    props = discover(m, meta, all_releases)
    new_text, diff = patch_text(m, props)
    new, excl = check_patch(m, new_text, meta) if diff else ([], [])
    known = _known(m, meta)
    from packaging.version import Version

    newest = {}
    for p in PACKAGES:
        f = _final(meta.versions(dist_of(p)))
        if f:
            newest[p] = str(f[-1])
    return Discovery(m.path, newest, {p: str(max(map(Version, v))) for p, v in known.items() if v},
                     props, diff, new, excl)


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("--matrix", default=None, help="matrix YAML (default: the bundled matrix/verl.yaml)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATCH", help="write the proposal as a unified diff to PATCH")
    g.add_argument("--apply", action="store_true", help="apply the proposal to the matrix file")
    p.add_argument("--all", action="store_true",
                   help="propose every newer engine release (default: the newest per torch pin)")
    p.add_argument("--json", action="store_true", help="print the findings (and the patch) as JSON")


def summary_text(d: Discovery) -> str:
    out = [f"matrix {d.matrix}: newest on the index vs newest in the matrix: " +
           ", ".join(f"{p} {d.newest.get(p, '-')} / {d.known.get(p, '-')}" for p in PACKAGES)]
    if not d.proposals:
        out.append("nothing new upstream")
    for p in d.proposals:
        line = f"  {p.package} {p.version}: {p.why}"
        if p.torch:
            line += f"; torch {p.torch} (default index: {p.default_cuda}); CUDA variants: {', '.join(p.cuda) or 'none'}"
        out.append(line)
        out += [f"    note: {n}" for n in p.notes]
        if p.package in (*VERSIONED_ENGINES, "verl"):
            mark = f"verl{p.version}-" if p.package == "verl" else f"-{p.package}{p.version}-torch"
            mine = [c for c in d.new_combos if mark in c["id"]]
            lost = [e for e in d.excluded if mark in e["id"]]
            out.append(f"    -> {len(mine)} new combination(s)" + (
                f"; all {len(lost)} excluded by the matrix, e.g. {lost[-1]['reason']}" if lost and not mine else ""))
    out.append(f"{len(d.new_combos)} new combination(s) with the patch" +
               (f", {len(d.excluded)} more excluded by the matrix's rules" if d.excluded else ""))
    out += [f"  + {c['id']}" for c in d.new_combos]
    return "\n".join(out) + "\n"


def run(args) -> int:
    m = matrix_from_args(args)
    meta = Metadata()
    d = run_discovery(m, meta, args.all)
    if args.write:
        write_atomic(args.write, d.patch)
    if args.apply and d.patch:
        new_text, _ = patch_text(m, d.proposals)
        write_atomic(m.path, new_text)
    if args.json:
        json.dump(d.to_dict(), sys.stdout, indent=2)
        print()
        return 0
    sys.stderr.write(summary_text(d))
    if args.write:
        print(f"patch written to {args.write}" if d.patch else f"nothing to patch; {args.write} is empty",
              file=sys.stderr)
    elif args.apply:
        print(f"applied to {m.path}" if d.patch else "nothing to apply", file=sys.stderr)
    else:
        sys.stdout.write(d.patch)
    return 0
