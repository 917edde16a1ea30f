"""A small ELF reader: dynamic symbols, DT_NEEDED, RUNPATH and required symbol versions.

Pure Python (no binutils in most images). Native extensions cannot be dlopen'ed on a host without
the NVIDIA driver, which would hide ABI errors, so the probe checks them statically: every undefined
torch symbol of an extension must be exported by the installed torch libraries.
"""

from __future__ import annotations

import mmap
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field

SHT_DYNSYM, SHT_DYNAMIC, SHT_GNU_VERNEED = 11, 6, 0x6FFFFFFE
DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 14, 15, 29
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10

# Mangled names in torch's namespaces (c10, at, torch, caffe2), incl. vtables/typeinfo, and
# torch's C shim (torch_*, aoti_torch_*) that stable-ABI extensions use.
TORCH_SYMBOL = re.compile(r"^(?:_Z(?:T[VIS])?N[KVr]*(?:3c10|2at|5torch|6caffe2)|_Z(?:3c10|2at|5torch)|aoti_torch_|torch_)")


class NotElf(ValueError):
    pass


@dataclass
class ElfInfo:
    path: str
    undefined: set[str] = field(default_factory=set)  # strong undefined symbols
    defined: set[str] = field(default_factory=set)  # exported (global/weak, defined) symbols
    needed: list[str] = field(default_factory=list)
    soname: str | None = None
    runpath: list[str] = field(default_factory=list)
    verneed: dict[str, set[str]] = field(default_factory=dict)  # library -> required versions


def _cstr(buf, off: int) -> str:
    end = buf.find(b"\0", off)
    return bytes(buf[off:end]).decode("utf-8", "replace")


def read_elf(path: str, want_defined: bool = True, want_symbols: bool = True) -> ElfInfo:
    """want_symbols=False: only the dynamic section and the version needs (a few pages of a large
    library, where its symbol table is megabytes)."""
    info = ElfInfo(path)
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise NotElf(path) from e
    try:
        if buf[:4] != b"\x7fELF":
            raise NotElf(path)
        if buf[4] != 2 or buf[5] != 1:
            raise NotElf(f"{path}: only 64-bit little-endian ELF is supported")
        e_shoff, = struct.unpack_from("<Q", buf, 0x28)
        e_shentsize, e_shnum = struct.unpack_from("<HH", buf, 0x3A)
        secs = [struct.unpack_from("<IIQQQQIIQQ", buf, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        for s in secs:
            sh_type, sh_offset, sh_size, sh_link = s[1], s[4], s[5], s[6]
            strtab = secs[sh_link][4] if sh_link < len(secs) else 0
            if sh_type == SHT_DYNSYM and want_symbols:
                for (st_name, st_info, st_other, st_shndx, _v, _s) in struct.iter_unpack(
                        "<IBBHQQ", buf[sh_offset:sh_offset + sh_size]):
                    if not st_name:
                        continue
                    bind = st_info >> 4
                    if st_shndx == 0:
                        if bind == STB_GLOBAL:
                            info.undefined.add(_cstr(buf, strtab + st_name))
                    elif want_defined and bind in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE) and (st_other & 3) in (0, 3):
                        info.defined.add(_cstr(buf, strtab + st_name))
            elif sh_type == SHT_DYNAMIC:
                for tag, val in struct.iter_unpack("<qQ", buf[sh_offset:sh_offset + sh_size]):
                    if tag == 0:
                        break
                    if tag == DT_NEEDED:
                        info.needed.append(_cstr(buf, strtab + val))
                    elif tag == DT_SONAME:
                        info.soname = _cstr(buf, strtab + val)
                    elif tag in (DT_RPATH, DT_RUNPATH):
                        info.runpath += [p for p in _cstr(buf, strtab + val).split(":") if p]
            elif sh_type == SHT_GNU_VERNEED:
                off = sh_offset
                while True:
                    vn_version, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", buf, off)
                    lib = _cstr(buf, strtab + vn_file)
                    aoff = off + vn_aux
                    for _ in range(vn_cnt):
                        _h, _fl, _o, vna_name, vna_next = struct.unpack_from("<IHHII", buf, aoff)
                        info.verneed.setdefault(lib, set()).add(_cstr(buf, strtab + vna_name))
                        if not vna_next:
                            break
                        aoff += vna_next
                    if not vn_next:
                        break
                    off += vn_next
    finally:
        buf.close()
    return info


def is_torch_symbol(sym: str) -> bool:
    return bool(TORCH_SYMBOL.match(sym))


def demangle(symbols: list[str]) -> dict[str, str]:
    """Readable names via c++filt when the image has it; otherwise the mangled names."""
    out = {s: s for s in symbols}
    exe = shutil.which("c++filt")
    if not exe or not symbols:
        return out
    try:
        r = subprocess.run([exe], input="\n".join(symbols), capture_output=True, text=True, timeout=20)
        lines = r.stdout.splitlines()
        if len(lines) == len(symbols):
            out.update(zip(symbols, lines))
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def version_key(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v))
