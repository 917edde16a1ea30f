"""Which GPU architectures native code carries, read from ELF files without a GPU or CUDA tools.

A CUDA library keeps its kernels in the ELF section `.nv_fatbin`: a run of fat-binary containers
(header magic 0xBA55ED50), each a run of entries, one per compiled variant: SASS (a cubin for one
`sm_XY`) or PTX (for a virtual `compute_XY`, compiled by the driver at load). Only the entry
headers are read (seek past the payloads), so even a 1 GB libtorch_cuda takes well under a second.

Compatibility rules (NVIDIA's CUDA compatibility guide): a cubin for sm_XY runs on a GPU of the
same major X with minor >= Y, and so does a family-specific one (sm_100f: 10.0 and 10.3), except
arch-specific cubins (sm_90a, sm_100a, sm_103a, sm_120a), which run on that exact GPU only; PTX for
compute_XY is JIT-compiled for any GPU with compute capability >= XY. A GPU with neither fails
with "no kernel image is available for execution on the device" (the B300 reports: wheels with
sm_100a cubins and no PTX). Which kind a cubin is, the entry header says in its flags: bit
ARCH_SPECIFIC (0x100000) for sm_XYa, FAMILY (0x200000) for sm_XYf, as nvcc 12.4 and 13.0 write
them (tests/fatbin/: vLLM's FA3 kernels are all sm_90a, torch cu124 carries two sm_90a cubins
beside its plain sm_90 ones). A file runs on a GPU when any of its cubins does (its kernels for
other GPUs are dispatched at run time), so a plain sm_100 cubin counts for the B300 (10.3) and an
sm_100a one only for the B200. A cubin whose kind is unknown counts for its exact GPU only: a
wheel may be said not to cover a GPU it runs on, never the reverse.

Standard library only: this runs inside images as part of the probe.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from .hardware import CUDA_KIND, parse_gpu

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_SASS = 1, (2, 0x10)  # 0x10: a cubin stored the alternate way; cuobjdump lists it as ELF
# Entry header: kind, ?, header size, payload size (8-aligned, with padding), stored size, ?, minor,
# arch, name offset and size, flags (u64).
_ENTRY = struct.Struct("<HHIQIII IIIQ")
ARCH_SPECIFIC, FAMILY = 0x100000, 0x200000  # flags of an sm_XYa and an sm_XYf cubin
GPUS = CUDA_KIND.gpus  # product name -> compute capability: the kind's own table


ARCH_SPECIFIC_FROM = 90  # sm_90a was the first arch-specific target: below it every cubin is portable


@dataclass
class Coverage:
    """The variants one file (or one package, merged) carries. `portable`: the SASS architectures
    with at least one cubin that is not arch-specific (plain or family), read from the flags."""
    sass: set[int] = field(default_factory=set)
    ptx: set[int] = field(default_factory=set)
    portable: set[int] = field(default_factory=set)

    def merge(self, other: "Coverage") -> None:
        self.sass |= other.sass
        self.ptx |= other.ptx
        self.portable |= other.portable

    def _portable(self, s: int) -> bool:
        return s < ARCH_SPECIFIC_FROM or s in self.portable

    def runs_on(self, cc: int) -> bool:
        if any(s == cc or (self._portable(s) and s // 10 == cc // 10 and s <= cc) for s in self.sass):
            return True
        return any(p <= cc for p in self.ptx)

    def to_dict(self) -> dict:
        return {"sass": [f"sm_{s}" + ("" if self._portable(s) else "a") for s in sorted(self.sass)],
                "ptx": [f"compute_{p}" for p in sorted(self.ptx)]}

    def empty(self) -> bool:
        return not self.sass and not self.ptx


def parse_sm(value: str) -> int | None:
    """`sm_90`, `sm90`, `90`, `9.0`, `compute_90`, or a product name (H100, GB200) -> 90: what
    hardware.parse_gpu reads, as CUDA's number."""
    return CUDA_KIND.arch_number(parse_gpu(value))


def _fatbin_range(f) -> tuple[int, int] | None:
    """(offset, size) of the `.nv_fatbin` section of an ELF64 little-endian file, or None."""
    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if not shoff or shentsize < 64 or shnum == 0 or shstrndx >= shnum:
        return None
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    if len(table) < shentsize * shnum:
        return None

    def sh(i):
        return struct.unpack_from("<IIQQQQ", table, i * shentsize)  # name, type, flags, addr, offset, size

    _, _, _, _, str_off, str_size = sh(shstrndx)
    f.seek(str_off)
    names = f.read(min(str_size, 1 << 20))
    for i in range(shnum):
        name_off, sh_type, _, _, off, size = sh(i)
        end = names.find(b"\0", name_off)
        if names[name_off:end] == b".nv_fatbin" and sh_type != 8:  # 8: SHT_NOBITS
            return off, size
    return None


def read_coverage(path: str | os.PathLike) -> Coverage:
    """The SASS and PTX architectures in one ELF file (empty: no CUDA kernels, or not ELF)."""
    cov = Coverage()
    with open(path, "rb") as f:
        rng = _fatbin_range(f)
        if not rng:
            return cov
        start, size = rng
        pos, end = start, start + size
        while pos + 16 <= end:
            f.seek(pos)
            hdr = f.read(16)
            magic, _version, hsize, fat_size = struct.unpack("<IHHQ", hdr)
            if magic != FATBIN_MAGIC:
                pos += 8  # containers are 8-aligned; padding between them is zero
                continue
            epos, eend = pos + hsize, min(pos + hsize + fat_size, end)
            while epos + _ENTRY.size <= eend:
                f.seek(epos)
                kind, _, ehsize, payload, _, _, _, arch, _, _, flags = _ENTRY.unpack(f.read(_ENTRY.size))
                if ehsize < _ENTRY.size:
                    break  # not an entry: the container is damaged; stop reading it
                if kind == KIND_PTX:
                    cov.ptx.add(arch)
                elif kind in KIND_SASS:
                    cov.sass.add(arch)
                    if not flags & ARCH_SPECIFIC:
                        cov.portable.add(arch)
                epos += ehsize + payload
            pos = max(eend, pos + 16)
    return cov


def is_elf_library(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def scan(root: str | os.PathLike) -> dict[str, Coverage]:
    """{file path relative to root: coverage} for every shared library with CUDA kernels under root."""
    out: dict[str, Coverage] = {}
    seen: set[str] = set()
    for dirpath, _dirs, files in os.walk(root):
        libs = [os.path.join(dirpath, n) for n in files if is_elf_library(n)]
        # Each file once, under its own name first: a soname link (libx.so -> libx.so.1) is the same
        # file; a link to a file elsewhere (a venv built in place links the node's torch) is read.
        for p in sorted(libs, key=os.path.islink):
            real = os.path.realpath(p)
            if real in seen:
                continue
            seen.add(real)
            try:
                cov = read_coverage(real)
            except (OSError, struct.error):
                continue
            if not cov.empty():
                out[os.path.relpath(p, root)] = cov
    return out


def supported(coverages: dict[str, Coverage], candidates=None) -> tuple[list[int], dict[int, list[str]]]:
    """(GPUs every file runs on, {GPU: files that lack it}) over the known compute capabilities."""
    ccs = sorted(set(candidates or GPUS.values()))
    ok, missing = [], {}
    for cc in ccs:
        lacking = sorted(k for k, c in coverages.items() if not c.runs_on(cc))
        if lacking:
            missing[cc] = lacking
        else:
            ok.append(cc)
    return ok, missing


def _package(rel: str) -> str:
    """The distribution-ish owner of a library path under site-packages: torch, vllm, nvidia/cublas."""
    parts = rel.replace(os.sep, "/").split("/")
    if parts[0] == "nvidia" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0].split(".libs")[0] if parts[0].endswith(".libs") else parts[0]


def image_coverage(site_dirs) -> dict:
    """What the probe records: per package the architectures its native code carries, the GPUs
    (by compute capability, named by sm_XY) that every judged package (the stack's extensions:
    torch, the engine, its kernels) runs on, and for the others the packages that lack them."""
    per_pkg: dict[str, Coverage] = {}
    for root in site_dirs:
        if not os.path.isdir(root):
            continue
        for rel, cov in scan(root).items():
            per_pkg.setdefault(_package(rel), Coverage()).merge(cov)
    # NVIDIA's own CUDA libraries (nvidia/*: cuBLAS, cuFFT, cuDNN, ...) are left out of the
    # verdict: some keep their kernels outside .nv_fatbin (libcufft 11.2 shows one sm_52 cubin to
    # cuobjdump too) and load them at run time; their GPUs follow their CUDA release, which the
    # row's CUDA and minimum driver already state. The extensions built for this stack decide.
    judged = {k: v for k, v in per_pkg.items() if not k.startswith("nvidia/")}
    ok, missing = supported(judged)
    return {"packages": {k: v.to_dict() for k, v in sorted(per_pkg.items())}, "judged": sorted(judged),
            "supports": [f"sm_{cc}" for cc in ok],
            "lacking": {f"sm_{cc}": pkgs for cc, pkgs in missing.items()}}


def main(argv: list[str]) -> int:
    """`python -m ….fatbin ROOT…`: image_coverage of the roots as one JSON line. env starts it
    beside torch's import: reading every extension's ELF is seconds of Python that would
    otherwise hold the GIL the gpu level's warm-up needs (bench/probe_warm_import_h100.json)."""
    import json
    print(json.dumps(image_coverage(argv)))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
