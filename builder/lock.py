"""`envbuild lock`: hash-pinned, era-consistent locks, one per image layer.

Each combination is resolved in layers, least volatile first: torch (with its CUDA wheels),
then the engine, then verl. Every layer is a full `uv pip compile` of everything up to it,
"as of" its era (`--exclude-newer` = newest pinned release + grace), seeded with the layer
below as preferences; the layer installs only what differs from the layer below. So:
- satisfiability is decided by a real, whole resolution (never by the layering);
- the torch layer depends only on (CUDA variant, torch, Python, platform) and the engine layer
  only on that plus the engine: combinations that share them share identical layer files, and
  so identical image layers;
- the full lock of a combination is the union of its layers.
Results, including an `unsatisfiable` verdict, are cached by the hash of their inputs: a second
lock of the same plan does no network work.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import EnvbuildError, InfraError
from .fsutil import write_atomic, write_json_atomic
from .index import Metadata, TorchSource, redact, torch_source
from .matrix import Combo, Matrix

LAYERS = ("torch", "engine", "verl")

# uv's messages -> our classes. An unreachable index is infrastructure, never a verdict.
_NET_RE = re.compile(r"(error sending request|Could not connect|connection (refused|reset)|dns error|"
                     r"timed out|Failed to fetch|failed to lookup address|tls|certificate|"
                     r"Network unreachable|HTTP status server error|status code 5\d\d)", re.I)


@dataclass
class LayerLock:
    name: str  # torch | engine | verl
    path: str  # the requirements this layer installs (pinned, hashed)
    sha256: str
    packages: dict[str, str]  # name -> version installed by this layer
    era: str
    key: str  # hash of the layer's inputs


@dataclass
class LockResult:
    combo: Combo
    status: str  # ok | unsatisfiable | index-unreachable | lock-error
    detail: str = ""
    layers: list[LayerLock] = field(default_factory=list)
    lock_hash: str | None = None
    full_lock: str | None = None
    era: str = ""
    torch_index: str = "default"  # "default" or the (redacted) PyTorch index URL
    cached: bool = False
    tools: str = ""  # hashed lock of the build tools (uv) that install the layers


    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["combo"] = self.combo.to_dict()
        return d


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _uv() -> str:
    exe = shutil.which("uv")
    if exe:
        return exe
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except Exception as e:  # noqa: BLE001
        raise EnvbuildError(f"uv not found ({e}); install envbuild's dependencies") from None


def _uv_version() -> str:
    out = subprocess.run([_uv(), "--version"], capture_output=True, text=True)
    return out.stdout.strip()


def era(dates: list[str], grace_days: int) -> str:
    newest = max(dt.datetime.fromisoformat(d.replace("Z", "+00:00")) for d in dates)
    return (newest + dt.timedelta(days=grace_days)).strftime("%Y-%m-%d")


def platform_tag(glibc: str) -> str:
    return f"x86_64-manylinux_{glibc.replace('.', '_')}"


# --------------------------------------------------------------------------- requirement files


def parse_lock(text: str) -> dict[str, tuple[str, str]]:
    """uv's hashed output -> {name: (version, block text)}; a block is the pin + its hashes."""
    out: dict[str, tuple[str, str]] = {}
    block: list[str] = []

    def flush():
        if block:
            m = re.match(r"^([A-Za-z0-9_.\-\[\],]+)==(\S+)", block[0])
            if m:
                name = re.sub(r"\[.*\]", "", m.group(1)).lower().replace("_", "-")
                out[name] = (m.group(2), "\n".join(block) + "\n")
        block.clear()

    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith((" ", "\t")):
            block.append(line)
        else:
            flush()
            block.append(line)
    flush()
    return out


def layer_text(full: dict[str, tuple[str, str]], below: dict[str, tuple[str, str]], header: str) -> str:
    lines = [header]
    for name in sorted(full):
        if below.get(name, (None,))[0] != full[name][0]:
            lines.append(full[name][1].rstrip("\n"))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- resolving


class Locker:
    """Locks combinations; one instance shares its metadata and cache across a plan."""

    def __init__(self, matrix: Matrix, meta: Metadata | None = None, cache: Path | None = None):
        from .paths import cache_dir

        self.matrix = matrix
        self.meta = meta or Metadata()
        self.cache = cache or cache_dir() / "locks"
        self.cache.mkdir(parents=True, exist_ok=True)
        self._uv_version: str | None = None
        self.uv_runs = 0  # how many resolutions actually ran (0 on a fully cached plan)

    @property
    def uv_version(self) -> str:
        if self._uv_version is None:
            self._uv_version = _uv_version()
        return self._uv_version

    def _stack(self, c: Combo, src: TorchSource) -> list[tuple[str, list[str], list[tuple[str, str]]]]:
        """(layer, requirements, releases that date it) for each layer of the combination."""
        # A non-default variant is pinned by its local version, so no later resolution can
        # swap in the default index's build of the same release.
        torch_req = f"torch=={c.torch}" + (f"+{c.cuda}" if src.url else "")
        layers = [("torch", [torch_req], [("torch", c.torch)])]
        reqs, dated = [torch_req], [("torch", c.torch)]
        if c.engine != "hf":
            extras = self.meta.engine_extras(c.engine, c.engine_version)
            eng = c.engine + (f"[{','.join(extras)}]" if extras else "")
            reqs = reqs + [f"{eng}=={c.engine_version}"]
            dated = dated + [(c.engine, c.engine_version)]
            layers.append(("engine", reqs, dated))
        layers.append(("verl", reqs + [f"verl=={c.verl}"], dated + [("verl", c.verl)]))
        return layers

    def lock(self, c: Combo, out_dir: str | os.PathLike | None = None) -> LockResult:
        try:
            src = torch_source(c.cuda, c.torch, self.meta)
        except InfraError as e:
            return LockResult(c, e.cause, e.message)
        res = LockResult(c, "ok", torch_index=redact(src.url) if src.url else "default")
        below: dict[str, tuple[str, str]] = {}
        seed = ""
        all_cached = True
        for name, reqs, dated in self._stack(c, src):
            try:
                when = era([self.meta.released(p, v) for p, v in dated], self.matrix.grace_days)
            except InfraError as e:
                return LockResult(c, e.cause, e.message, torch_index=res.torch_index)
            except EnvbuildError as e:  # a release that is not on the index
                return LockResult(c, "unsatisfiable", str(e), torch_index=res.torch_index)
            key = _sha(json.dumps({"reqs": reqs, "era": when, "python": c.python, "platform": platform_tag(c.glibc),
                                   "torch_index": res.torch_index, "seed": _sha(seed), "uv": self.uv_version}))
            status, text, cached = self._compile(key, reqs, when, c, src, seed)
            all_cached &= cached
            if status != "ok":
                res.status, res.detail, res.era = status, text, when
                res.cached = all_cached
                return res
            full = parse_lock(text)
            # The header names only the layer's own inputs, so combinations share its bytes.
            header = (f"# envbuild {name} layer for {' '.join(reqs)}: pins that differ from the layer below\n"
                      f"# resolved as of {when} (uv --exclude-newer) for Python {c.python}, {platform_tag(c.glibc)}")
            body = layer_text(full, below, header)
            res.layers.append(LayerLock(name, "", _sha(body), {k: full[k][0] for k in full
                                                                 if below.get(k, (None,))[0] != full[k][0]}, when, key))
            res.layers[-1].path = body  # the text for now; written below
            below, seed, res.era = full, text, when
        status, tools, cached = self._compile(
            _sha(json.dumps({"tools": self.uv_version, "python": c.python, "platform": platform_tag(c.glibc)})),
            [f"uv=={self.uv_version.split()[1]}"], "", c, TorchSource(c.cuda, c.cuda, None), "")
        if status != "ok":
            res.status, res.detail = status, tools
            return res
        res.tools = tools
        res.cached = all_cached and cached
        res.full_lock = seed
        res.lock_hash = _sha(seed)
        if out_dir is not None:
            self.write(res, Path(out_dir))
        return res

    def write(self, res: LockResult, out_dir: Path) -> Path:
        d = out_dir / res.combo.id
        for layer in res.layers:
            text = layer.path if not os.path.exists(str(layer.path)) else Path(layer.path).read_text()
            p = write_atomic(d / f"{layer.name}.txt", text)
            layer.path = str(p)
        if res.full_lock is not None and not os.path.exists(res.full_lock):
            res.full_lock = str(write_atomic(d / "full.txt", res.full_lock))
        if res.tools:
            write_atomic(d / "tools.txt", res.tools)
        write_json_atomic(d / "lock.json", res.to_dict())
        return d

    def _compile(self, key: str, reqs: list[str], when: str, c: Combo, src: TorchSource, seed: str):
        """-> (status, lock text or explanation, cached)"""
        cpath = self.cache / f"{key}.json"
        if cpath.exists():
            d = json.loads(cpath.read_text())
            return d["status"], d["text"], True
        self.uv_runs += 1
        with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp:
            inp, outp = Path(tmp) / "requirements.in", Path(tmp) / "requirements.txt"
            inp.write_text("\n".join(reqs) + "\n")
            if seed:
                outp.write_text(seed)  # uv prefers the versions already in the output file
            cmd = [_uv(), "pip", "compile", str(inp), "-o", str(outp), "--generate-hashes", "--no-header",
                   "--python-version", c.python, "--python-platform", platform_tag(c.glibc),
                   "--quiet"] + (["--exclude-newer", when] if when else [])
            if src.url:
                cmd += ["--index", src.url]  # searched before the default index
            env = {**os.environ, "UV_NO_PROGRESS": "1"}
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
            except subprocess.TimeoutExpired:
                return "index-unreachable", "uv pip compile timed out after 900 s", False
            if p.returncode == 0:
                status, text = "ok", outp.read_text()
            else:
                err = p.stderr.strip()
                if "No solution found" in err:
                    status = "unsatisfiable"
                elif _NET_RE.search(err):
                    status = "index-unreachable"
                else:
                    status = "lock-error"
                text = err[-4000:]
        if status in ("ok", "unsatisfiable"):  # verdicts are stable under --exclude-newer: cache them
            write_json_atomic(cpath, {"status": status, "text": text})
        return status, text, False


# --------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    from .matrix import add_selector_args

    add_selector_args(p)
    p.add_argument("--out", default="locks", help="output folder (default: ./locks)")
    p.add_argument("--json", action="store_true", help="print one JSON object per combination")


def run(args) -> int:
    from .matrix import matrix_from_args
    from .plan import plan_from_args

    meta = Metadata()
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    locker = Locker(m, meta)
    worst = 0
    for c in pl.combos:
        r = locker.lock(c, args.out)
        if not r.ok:
            locker.write(r, Path(args.out))
        if args.json:
            print(json.dumps({"id": c.id, "status": r.status, "lock_hash": r.lock_hash, "era": r.era,
                              "cached": r.cached, "detail": r.detail, "torch_index": r.torch_index,
                              "layers": {l.name: l.packages for l in r.layers}}))
        else:
            line = f"{c.id}: {r.status}"
            if r.ok:
                line += f" (as of {r.era}, {sum(len(l.packages) for l in r.layers)} packages" \
                        f"{', cached' if r.cached else ''}) -> {Path(args.out) / c.id}"
            else:
                line += ": " + " ".join(r.detail.split())[:600]
            print(line)
        if r.status in ("index-unreachable", "lock-error"):
            worst = max(worst, 3)
        elif not r.ok:
            worst = max(worst, 1)
    print(f"uv resolutions run: {locker.uv_runs}", file=sys.stderr)
    return worst
