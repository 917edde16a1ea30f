"""The hash-pinned requirements format the locks are written in (uv's `--generate-hashes`
output): read into blocks per package, and a layer's file written from them. Pure text: the
SBOM reads locks with it without the resolver.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from packaging.utils import canonicalize_name


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


def layer_text(full: dict[str, tuple[str, str]], names, header: str) -> str:
    """The requirements file of one layer: the blocks of `names`, as the full resolution has them."""
    lines = [header]
    for name in sorted(names):
        lines.append(full[name][1].rstrip("\n"))
    return "\n".join(lines) + "\n"


def text_of(value: str | None) -> str:
    """A lock's text from LayerLock.path / LockResult.full_lock, which hold the text before
    Locker.write and the path of the file after."""
    if not value:
        return ""
    if "\n" not in value and os.path.isfile(value):
        return Path(value).read_text()
    return value


def pins_of(lock_text: str) -> dict[str, tuple[str, set[str]]]:
    """{name: (version, {sha256})} of a hashed lock file."""
    out = {}
    for name, (version, block) in parse_lock(lock_text).items():
        hashes = {h for h in (part.split("sha256:", 1)[1].split()[0].rstrip("\\").strip()
                              for part in block.split("--hash=")[1:] if "sha256:" in part)}
        out[canonicalize_name(name)] = (version, hashes)
    return out


def dependents_of(lock_text: str) -> dict[str, list[str]]:
    """{name: the names uv's `# via` comments give for it}; `-r <file>` means asked for directly."""
    out: dict[str, list[str]] = {}
    current, in_via = None, False
    for line in lock_text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==", line)
        if m:
            current, in_via = canonicalize_name(m.group(1)), False
            out.setdefault(current, [])
            continue
        s = line.strip()
        if current is None or not s.startswith("#"):
            continue
        s = s[1:].strip()
        if s.startswith("via"):
            in_via = True
            s = s[3:].strip()
        elif not in_via:
            continue
        if s:
            out[current].append(s if s.startswith("-r") else canonicalize_name(s.split()[0]))
    return out
