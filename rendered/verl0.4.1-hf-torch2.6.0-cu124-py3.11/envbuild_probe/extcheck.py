"""Static check of native extensions against the installed torch (no dlopen, no driver needed).

For each distribution that ships shared objects and builds on torch (the engine, its kernel
packages, flash-attn, ...): every undefined torch symbol must be exported by torch's libraries,
every DT_NEEDED library must be findable, and every required GLIBC version must be present.
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import os
import platform
import re
import sys
from dataclasses import dataclass, field

from .elfsyms import NotElf, demangle, is_torch_symbol, read_elf, version_key
from .vocab import ENGINE_SPECS

# Distributions always scanned when installed, besides any that requires torch: every engine's
# own and its kernels (vocab.ENGINE_SPECS), and the other native extensions stacks carry.
KNOWN_NATIVE = tuple(sorted({e.dist for e in ENGINE_SPECS if e.versioned} | {k for e in ENGINE_SPECS for k in e.kernels}
                            | {"flash-attn", "flash_attn_3", "xformers", "deep-gemm", "torchvision", "torchaudio"}))
DRIVER_LIBS = re.compile(r"^lib(cuda|nvidia-ml|nvidia-\w+)\.so")
CUDA_LIBS = re.compile(r"^lib(cudart|cublas|cublasLt|cudnn\w*|nccl|nvrtc|cufft|curand|cusparse\w*|cusolver|"
                       r"nvJitLink|nvToolsExt|cupti|cufile|nvshmem\w*|cuda\w+)\.so")
# Plugins loaded on demand (torchaudio's sox/ffmpeg backends): their absence breaks nothing else.
OPTIONAL_LIBS = re.compile(r"^lib(sox|av\w+|sw\w+|postproc)\.so")
SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
               "/usr/local/lib", "/usr/local/cuda/lib64", "/usr/local/nvidia/lib64",
               "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")


@dataclass
class ExtProblem:
    dist: str
    file: str
    kind: str  # "undefined-symbol" | "cuda-runtime-missing" | "library-missing" | "no-driver" | "glibc-too-old"
    what: str


# A library built for one torch release, named for it (torch_c_dlpack_ext ships
# libtorch_c_dlpack_addon_torch27-cuda.so beside ...torch28...; the package loads the one for the
# torch it finds): `torch27`, `torch2.7`, `torch-2.7`.
TORCH_TAG = re.compile(r"torch[-_.]?(\d)[._]?(\d{1,2})(?![0-9])")


def torch_variants(paths: list[str], torch_version: str | None) -> tuple[list[str], list[str]]:
    """(loaded, never loaded): a package that ships one library per torch release loads only the
    installed torch's; the others are never loaded and not checked. Files named for no torch
    release, and packages with a single such file, are all kept."""
    mm = re.match(r"(\d+)\.(\d+)", torch_version or "")
    groups: dict[str, list[tuple[str, str]]] = {}
    plain = []
    for p in paths:
        base = os.path.basename(p)
        m = TORCH_TAG.search(base)
        if not m or not mm:
            plain.append(p)
            continue
        key = os.path.join(os.path.dirname(p), base[:m.start()] + "{}" + base[m.end():])
        groups.setdefault(key, []).append((f"{m.group(1)}.{int(m.group(2))}", p))
    kept, skipped = list(plain), []
    want = f"{mm.group(1)}.{int(mm.group(2))}" if mm else ""
    for members in groups.values():
        if len({v for v, _ in members}) < 2:
            kept += [p for _, p in members]
            continue
        kept += [p for v, p in members if v == want]
        skipped += [p for v, p in members if v != want]
    return kept, skipped


@dataclass
class ExtReport:
    scanned: dict[str, int] = field(default_factory=dict)  # dist -> number of .so files
    problems: list[ExtProblem] = field(default_factory=list)
    driver_libs: set[str] = field(default_factory=set)  # provided by the NVIDIA driver at run time
    optional_missing: set[str] = field(default_factory=set)
    # dist -> libraries built for other torch releases, never loaded with the installed one
    other_torch: dict[str, list[str]] = field(default_factory=dict)


def _is_so(path: str) -> bool:
    return bool(re.search(r"\.so(\.\d+)*$", path))


def _dist_files(dist: md.Distribution) -> list[str]:
    files = dist.files
    if files:
        return [str(dist.locate_file(f)) for f in files if _is_so(str(f))]
    # No RECORD: walk its top-level packages.
    out = []
    top = (dist.read_text("top_level.txt") or "").split()
    for t in top:
        p = str(dist.locate_file(t))
        for root, _d, fs in os.walk(p):
            out += [os.path.join(root, f) for f in fs if _is_so(f)]
    return out


def _requires_torch(dist: md.Distribution) -> bool:
    for r in dist.requires or []:
        if re.match(r"\s*torch\b(?![\w-])", r) and "extra ==" not in r:
            return True
    return False


def native_dists() -> list[md.Distribution]:
    seen, out = set(), []
    for d in md.distributions():
        name = (d.metadata["Name"] or "").lower().replace("_", "-")
        if not name or name in seen or name == "torch":
            continue
        if name in {k.replace("_", "-") for k in KNOWN_NATIVE} or _requires_torch(d):
            seen.add(name)
            out.append(d)
    return out


def torch_lib_dir() -> str | None:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def torch_exports(lib_dir: str) -> tuple[set[str], set[str]]:
    """Symbols exported by torch's libraries, and their SONAMEs: once torch is imported the loader
    resolves a DT_NEEDED by SONAME too (torch's bundled libgomp-<hash>.so.1 answers libgomp.so.1)."""
    syms: set[str] = set()
    sonames: set[str] = set()
    pkg = os.path.dirname(lib_dir)
    for p in glob.glob(os.path.join(lib_dir, "*.so*")) + glob.glob(os.path.join(pkg, "_C*.so")):
        try:
            info = read_elf(p)
        except (NotElf, OSError):
            continue
        syms |= info.defined
        sonames |= {os.path.basename(p)} | ({info.soname} if info.soname else set())
    return syms, sonames


def _search_dirs(so_path: str, runpath: list[str], lib_dir: str | None) -> list[str]:
    origin = os.path.dirname(so_path)
    dirs = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in runpath]
    dirs += [origin]
    if lib_dir:
        dirs.append(lib_dir)  # torch's libraries are loaded before any extension
    for sp in sys.path:  # torch preloads the CUDA libraries of the nvidia-* wheels
        dirs += glob.glob(os.path.join(sp, "nvidia", "*", "lib")) + glob.glob(os.path.join(sp, "nvidia", "cu*", "lib"))
    dirs += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += list(SYSTEM_DIRS)
    return dirs


def _glibc() -> str | None:
    name, ver = platform.libc_ver()
    return ver if name == "glibc" else None


def shipped_libs(dists) -> set[str]:
    """Names of the shared libraries that installed distributions ship.

    Packages load their own libraries at import (torch the nvidia-* wheels', tvm_ffi its
    libtvm_ffi.so through ctypes), so an extension that needs one finds it in the process
    without any search path naming it. If the importing package is not imported first, the
    contract level's imports fail and say so; here such a library is not "missing".
    """
    out: set[str] = set()
    for d in dists:
        for f in d.files or ():
            base = f.name
            if ".so" in base and _is_so(base):
                out.add(base)
    return out


def check_extensions(dists: list[md.Distribution] | None = None,
                     installed: list[md.Distribution] | None = None) -> ExtReport:
    rep = ExtReport()
    lib_dir = torch_lib_dir()
    exports, loaded = torch_exports(lib_dir) if lib_dir else (set(), set())
    loaded = loaded | shipped_libs(installed if installed is not None else md.distributions())
    glibc = _glibc()
    missing_syms: list[tuple[str, str, str]] = []
    try:
        torch_version = md.version("torch")
    except md.PackageNotFoundError:
        torch_version = None
    for d in dists if dists is not None else native_dists():
        name = d.metadata["Name"]
        sos, other = torch_variants([p for p in _dist_files(d) if os.path.isfile(p)], torch_version)
        if other:
            rep.other_torch[name] = sorted(os.path.relpath(p, str(d.locate_file(""))) for p in other)
        infos = []
        for p in sos:
            try:
                infos.append(read_elf(p))
            except (NotElf, OSError):
                continue
        rep.scanned[name] = len(infos)
        own = set().union(*(i.defined for i in infos)) if infos else set()
        for i in infos:
            rel = os.path.relpath(i.path, str(d.locate_file("")))
            for s in sorted(i.undefined):
                if is_torch_symbol(s) and s not in exports and s not in own:
                    missing_syms.append((name, rel, s))
            dirs = _search_dirs(i.path, i.runpath, lib_dir)
            for lib in i.needed:
                if lib in loaded or any(os.path.exists(os.path.join(dd, lib)) for dd in dirs) or _in_ld_cache(lib):
                    continue
                if lib in {os.path.basename(x.path) for x in infos} | {x.soname for x in infos}:
                    continue
                if DRIVER_LIBS.match(lib):  # the container runtime mounts the driver; never in an image
                    rep.driver_libs.add(lib)
                    continue
                if OPTIONAL_LIBS.match(lib):
                    rep.optional_missing.add(lib)
                    continue
                kind = "cuda-runtime-missing" if CUDA_LIBS.match(lib) else "library-missing"
                rep.problems.append(ExtProblem(name, rel, kind, lib))
            if glibc:
                for lib, vers in i.verneed.items():
                    for ver in vers:
                        if ver.startswith("GLIBC_2.") and version_key(ver) > version_key("GLIBC_" + glibc):
                            rep.problems.append(ExtProblem(name, rel, "glibc-too-old", f"{ver} (have {glibc})"))
    names = demangle([s for _n, _r, s in missing_syms])
    by_name = _exports_by_name(exports, names, missing_syms)
    for n, r, s in missing_syms:
        what = f"{names[s]} ({s})" if names[s] != s else s
        why = abi_diagnosis(s, exports, by_name.get(_bare(names[s])), names[s])
        rep.problems.append(ExtProblem(n, r, "undefined-symbol", f"{what}: {why}" if why else what))
    return rep


# std::string as the two C++ ABIs mangle it: _GLIBCXX_USE_CXX11_ABI=1 (std::__cxx11::basic_string)
# and =0 (the old copy-on-write string, `Ss`).
_CXX11_STRING = "NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
_OLD_STRING = "Ss"


_NEW_ABI = ("the extension was built with the C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=1), torch without it "
            "(=0): a wheel of the other ABI flavour is needed")
_OLD_ABI = ("the extension was built with the pre-C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=0), torch with the "
            "C++11 one (=1): a wheel of the other ABI flavour is needed")


def abi_diagnosis(sym: str, exports: set[str], torch_has: str | None, demangled: str = "") -> str:
    """Which side is wrong, in words: the extension's C++ string ABI against torch's, or the
    function torch exports under another signature (built for another torch release)."""
    if _CXX11_STRING in sym and sym.replace(_CXX11_STRING, _OLD_STRING) in exports:
        return _NEW_ABI
    if _CXX11_STRING not in sym and "Ss" in sym and _swap_old(sym) in exports:
        return _OLD_ABI
    if torch_has and "basic_string" in torch_has and "basic_string" in demangled:
        ours, theirs = "__cxx11::" in demangled, "__cxx11::" in torch_has
        if ours != theirs:  # the same function, strings mangled the other way (substitutions differ)
            return _NEW_ABI if ours else _OLD_ABI
    if torch_has:
        return f"torch exports it as {torch_has}: built for another torch release"
    return "not in the installed torch: built for another torch release"


def _swap_old(sym: str) -> str:
    # `Ss` only where it stands for std::string: after a qualifier or at a parameter boundary.
    return re.sub(r"(?<=[A-Z0-9_])Ss(?=[A-Z0-9_E]|$)", _CXX11_STRING, sym)


def _bare(demangled: str) -> str:
    """`c10::Device::str() const` -> `c10::Device::str`: a function's name without its signature."""
    return demangled.split("(", 1)[0].strip()


def _exports_by_name(exports: set[str], names: dict, missing) -> dict[str, str]:
    """For each missing function's bare name, one torch export of that name (demangled), if any:
    only the exports whose mangled form carries the name are demangled."""
    want = {_bare(names[s]) for _n, _r, s in missing if names[s] != s}
    if not want:
        return {}
    leaves = {w.rsplit("::", 1)[-1] for w in want}
    cand = [e for e in exports if any(f"{len(x)}{x}" in e for x in leaves)][:20000]
    dem = demangle(cand)
    out: dict[str, str] = {}
    for e in cand:
        b = _bare(dem.get(e, e))
        if b in want and b not in out:
            out[b] = dem.get(e, e)
    return out


_LD_CACHE: set[str] | None = None


def _in_ld_cache(lib: str) -> bool:
    global _LD_CACHE
    if _LD_CACHE is None:
        _LD_CACHE = set()
        import shutil
        import subprocess
        exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
        if exe:
            try:
                out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=20).stdout
                _LD_CACHE = {ln.split()[0] for ln in out.splitlines()[1:] if ln.strip()}
            except (OSError, subprocess.SubprocessError):
                pass
    return lib in _LD_CACHE
