"""What a lock is, as values: a combination's lock result and its layers, the cut of one
resolution into layers, the era, and the wheel tags and markers of an image's platform. Pure:
no resolver, no index (envbuild.lock resolves; the render, the wheelhouse and the census read).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import textwrap
from dataclasses import asdict, dataclass, field

from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name
from packaging.version import Version

from .lockfile import text_of
from .values import Combo
from .probe.hardware import DEFAULT_PLATFORM, platform_machine


@dataclass
class LayerLock:
    name: str  # torch | engine | verl
    path: str  # the requirements this layer installs (pinned, hashed)
    sha256: str
    packages: dict[str, str]  # name -> version installed by this layer
    era: str
    key: str  # hash of the layer's inputs

    def text(self) -> str:
        """The requirements text, whether `path` holds it or names the file it was written to."""
        return text_of(self.path)


@dataclass
class LockResult:
    combo: Combo
    status: str  # outcome.LOCK_OK, LOCK_VERDICTS or LOCK_INFRA
    detail: str = ""
    layers: list[LayerLock] = field(default_factory=list)
    lock_hash: str | None = None
    full_lock: str | None = None
    era: str = ""
    torch_index: str = "default"  # "default" or the (redacted) PyTorch index URL
    cached: bool = False
    tools: str = ""  # hashed lock of the build tools (uv) that install the layers
    relaxed: list[str] = field(default_factory=list)  # "X taken from <date>: ..." (era artefacts lifted)
    built_from_source: list[str] = field(default_factory=list)  # name==version without a usable wheel
    build_constraints: str = ""  # pins for the builds of those sdists ("" when none)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["combo"] = self.combo.to_dict()
        return d


def sha256_of(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def era(dates: list[str], grace_days: int) -> str:
    newest = max(dt.datetime.fromisoformat(d.replace("Z", "+00:00")) for d in dates)
    return (newest + dt.timedelta(days=grace_days)).strftime("%Y-%m-%d")


def platform_tag(glibc: str, platform: str = DEFAULT_PLATFORM) -> str:
    """uv's --python-platform for an image: `x86_64-manylinux_2_35`, `aarch64-manylinux_2_35`."""
    return f"{platform_machine(platform)}-manylinux_{glibc.replace('.', '_')}"


def _marker_env(python: str, platform: str = DEFAULT_PLATFORM) -> dict:
    return {"sys_platform": "linux", "platform_machine": platform_machine(platform), "platform_system": "Linux",
            "python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "os_name": "posix", "platform_release": "",
            "platform_version": "", "implementation_version": f"{python}.0"}


def exact_pins(requires_dist: list[str], python: str, extras: tuple[str, ...] = (),
               platform: str = DEFAULT_PLATFORM) -> dict[str, str]:
    """{name: version} of the requirements pinned with `==` that apply on the image's platform."""
    env = _marker_env(python, platform)
    out = {}
    for line in requires_dist:
        r = Requirement(line)
        if r.marker is not None and not any(r.marker.evaluate({**env, "extra": e}) for e in ("",) + extras):
            continue
        pins = [s.version for s in r.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if len(pins) == 1:
            out[canonicalize_name(r.name)] = pins[0]
    return out


def explain(detail: str, width: int = 100, indent: str = "    ") -> str:
    """uv's explanation, whole, wrapped for a terminal (its own line breaks kept)."""
    lines = []
    for line in detail.strip().splitlines():
        lead = line[:len(line) - len(line.lstrip())]
        lines += textwrap.wrap(line.strip(), width=width, initial_indent=indent + lead,
                               subsequent_indent=indent + lead + "  ", break_on_hyphens=False) or [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- requirement files


def split_layers(full: dict[str, tuple[str, str]], torch_pins: dict[str, str],
                 engine: str | None, engine_pins: dict[str, str]) -> dict[str, list[str]]:
    """Cut one resolution into layers. A package joins the torch (engine) layer only when torch
    (the engine) pins it exactly and the resolution has that very version, so a layer's content
    is fixed by torch (the engine) alone and every pin stays the resolution's."""
    def fixed(pins):
        return {n for n, v in pins.items() if n in full and Version(full[n][0]) == Version(v)}

    torch = {"torch"} | fixed(torch_pins)
    eng = (({engine} | fixed(engine_pins)) - torch) if engine else set()
    rest = set(full) - torch - eng
    out = {"torch": sorted(torch)}
    if engine:
        out["engine"] = sorted(eng)
    out["verl"] = sorted(rest)
    return out


def wheel_tags(python: str, glibc: str, platform: str = DEFAULT_PLATFORM) -> set:
    """The wheel tags an image with CPython `python` on glibc `glibc` for `platform` installs."""
    return set(ordered_wheel_tags(python, glibc, platform))


def ordered_wheel_tags(python: str, glibc: str, platform: str = DEFAULT_PLATFORM) -> list:
    """The same tags, the most specific first (the order an installer prefers them in)."""
    major, minor = (int(x) for x in python.split("."))
    gmaj, gmin = (int(x) for x in glibc.split("."))
    m_ = platform_machine(platform)
    plats = [f"manylinux_{gmaj}_{m}_{m_}" for m in range(gmin, 4, -1)]
    # The legacy aliases: manylinux2014 = 2_17 (both machines), 2010 and 1 (x86_64 only).
    plats += [f"manylinux2014_{m_}", f"linux_{m_}"] + (["manylinux2010_x86_64", "manylinux1_x86_64"]
                                                        if m_ == "x86_64" else [])
    return list(dict.fromkeys([*cpython_tags((major, minor), platforms=plats),
                               *compatible_tags((major, minor), platforms=plats)]))
