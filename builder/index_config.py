"""Which index serves what: the default index is whatever pip/uv are configured with (never a
host name written here), read from uv's and pip's own configuration; a torch build for an
accelerator variant that is not that torch release's default comes from the PyTorch index of the
variant (the public one unless ENVBUILD_PYTORCH_INDEX or the matrix's `pytorch_index` names a
mirror); index URLs are checked before they reach uv, a secret or a label, and redacted for logs.
The HTTP client and the metadata it reads are index.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import InfraError, InputError
from .probe.hardware import env_suffix, parse_variant

PYTORCH_INDEX_ENV = "ENVBUILD_PYTORCH_INDEX"
# The public PyTorch index (one folder per variant: cu126/, cu128/, ...); a mirror replaces it
# through ENVBUILD_PYTORCH_INDEX or the matrix's `pytorch_index`.
PYTORCH_INDEX_DEFAULT = "https://download.pytorch.org/whl"
# An index URL reaches uv, a BuildKit secret, a CI script and (redacted) a Dockerfile LABEL:
# http(s) and the characters RFC 3986 allows, less quotes, parentheses, `;`, `*`, `$` and any
# whitespace (a quote in ENVBUILD_PYTORCH_INDEX once injected a LABEL). Credentials with other
# characters are written percent-encoded, as URLs require anyway.
_INDEX_URL_RE = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!&+,=%-]+\Z")


def check_index_url(url: str, source: str, where: str = "environment") -> str:
    """`url` if it is a plain http(s) URL with a host; else an InputError naming its source."""
    try:
        ok = bool(_INDEX_URL_RE.fullmatch(url)) and bool(urllib.parse.urlsplit(url).hostname)
    except ValueError:  # e.g. an unbalanced [ in the host
        ok = False
    if not ok:
        shown = re.sub(r"//[^/@]*@", "//***@", url)  # never print a credential, even a malformed one
        raise InputError(where, None, source, shown,
                         "not an http(s) URL (no whitespace, quotes or $; percent-encode credentials)")
    return url


# --------------------------------------------------------------------------- which index


@lru_cache(maxsize=1)
def default_index_url() -> str:
    """The simple-API URL pip/uv are configured with (credentials included, if any).

    Read the way uv and pip read it, without importing either: the environment first, then uv's
    configuration files, then pip's; when nothing is configured, uv names its own default (so no
    host name is written here)."""
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return check_index_url(os.environ[var], var).rstrip("/")
    for source, url in _configured_index_urls():
        return check_index_url(url, "index-url", source).rstrip("/")
    return _uv_default_index()


def _uv_config_files() -> list[Path]:
    """uv's configuration files, most specific first (project, user, system), as uv finds them."""
    if os.environ.get("UV_NO_CONFIG"):
        return []
    if os.environ.get("UV_CONFIG_FILE"):
        return [Path(os.environ["UV_CONFIG_FILE"])]
    files = []
    for d in [Path.cwd(), *Path.cwd().parents]:  # the nearest project's uv.toml or pyproject.toml
        if (d / "uv.toml").is_file() or (d / "pyproject.toml").is_file():
            files += [d / "uv.toml", d / "pyproject.toml"]
            break
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    files.append(Path(xdg) / "uv" / "uv.toml")
    files += [Path(d) / "uv" / "uv.toml" for d in (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")]
    files.append(Path("/etc/uv/uv.toml"))
    return files


def _uv_config_index(path: Path) -> str | None:
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("uv", {})
    if not isinstance(data, dict):
        return None
    for idx in data.get("index", []) if isinstance(data.get("index"), list) else []:
        if isinstance(idx, dict) and idx.get("default") and isinstance(idx.get("url"), str):
            return idx["url"]
    for sect in (data, data.get("pip") if isinstance(data.get("pip"), dict) else {}):
        if isinstance(sect.get("index-url"), str):
            return sect["index-url"]
    return None


def _pip_config_files() -> list[Path]:
    """pip's configuration files, lowest priority first (global, user, site, PIP_CONFIG_FILE)."""
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []
    dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [Path(d) / "pip" / "pip.conf" for d in dirs] + [Path("/etc/pip.conf")]
    if not (env_file and os.path.exists(env_file)):  # pip skips the user's files then
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        files += [Path.home() / ".pip" / "pip.conf", Path(xdg) / "pip" / "pip.conf"]
    if os.environ.get("VIRTUAL_ENV"):
        files.append(Path(os.environ["VIRTUAL_ENV"]) / "pip.conf")
    if env_file:
        files.append(Path(env_file))
    return files


def _pip_config_index() -> tuple[str, str] | None:
    import configparser

    found = None
    for f in _pip_config_files():  # a later file overrides an earlier one, as in pip
        cp = configparser.RawConfigParser()
        try:
            cp.read(f)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for sect in ("global", "install"):  # [install] overrides [global] for `pip install`
            if cp.has_option(sect, "index-url") and cp.get(sect, "index-url").strip():
                found = (str(f), cp.get(sect, "index-url").strip())
    return found


def _configured_index_urls():
    """(source, url) of the configured default index: uv's files first, then pip's."""
    for f in _uv_config_files():
        url = _uv_config_index(f) if f.is_file() else None
        if url:
            yield str(f), url
    pip = _pip_config_index()
    if pip:
        yield pip


def uv_exe() -> str:
    """The uv executable: on PATH, else the one the `uv` package (a dependency) ships."""
    exe = shutil.which("uv")
    if exe:
        return exe
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except Exception as e:  # noqa: BLE001
        raise InfraError("lock-error", f"uv not found ({e}); install envbuild's dependencies") from None


def _uv_default_index() -> str:
    """The index uv uses when nothing is configured, as uv itself reports it."""
    with tempfile.TemporaryDirectory(prefix="envbuild-index-") as d:
        req = Path(d) / "empty.in"
        req.write_text("")
        try:
            out = subprocess.run([uv_exe(), "pip", "compile", str(req), "--emit-index-url", "--no-header",
                                  "--quiet", "--no-config"], capture_output=True, text=True, timeout=60,
                                 env={k: v for k, v in os.environ.items() if not k.startswith("UV_")})
        except (OSError, subprocess.TimeoutExpired) as e:
            raise InfraError("index-unreachable", f"cannot ask uv for its default index: {e}") from None
    m = re.search(r"^--index-url\s+(\S+)", out.stdout, re.M)
    if not m:
        raise InfraError("index-unreachable", f"uv did not name its default index: {out.stderr.strip()[:300]}")
    return m.group(1).rstrip("/")


def redact(url: str) -> str:
    """An index URL without its credentials, fit for logs and records."""
    p = urllib.parse.urlsplit(url)
    if p.username or p.password:
        p = p._replace(netloc=p.hostname + (f":{p.port}" if p.port else ""))
    return urllib.parse.urlunsplit(p)


@dataclass(frozen=True)
class TorchSource:
    """Where a combination's torch comes from."""

    variant: str  # cu124
    default_variant: str  # the variant of this torch release's wheels on the default index
    url: str | None  # None: the default index; else the PyTorch index for the variant

    @property
    def kind(self) -> str:
        return "default" if self.url is None else "pytorch"


def pytorch_index_root() -> str:
    """The configured PyTorch index root (ENVBUILD_PYTORCH_INDEX), checked; "" when unset."""
    root = os.environ.get(PYTORCH_INDEX_ENV, "")
    return check_index_url(root, PYTORCH_INDEX_ENV).rstrip("/") if root else ""


def torch_index_url(root: str, variant: str) -> str:
    """The PyTorch index of one accelerator variant, under the configured root: the one place its
    URL is made (the lock, the build's secret, the nightly's `envbuild ci torch-index`)."""
    v = parse_variant(variant)
    if v is None:
        raise InputError("matrix", None, "cuda", variant, "not an accelerator variant")
    return check_index_url(f"{root.rstrip('/')}/{v.index_path}", PYTORCH_INDEX_ENV)


def torch_index_env(variant: str) -> str:
    """The variable a bake file reads a variant's torch-index secret from: one per variant, since
    one bake file may hold several; a shell identifier for any variant (rocm6.2 -> ..._rocm6_2).
    The bake file names it and the nightly's build step exports it (`ci torch-index --export`)."""
    return "ENVBUILD_TORCH_INDEX_URL_" + env_suffix(variant)


def torch_source(variant: str, torch_version: str, meta, root: str | None = None,
                 machine: str = "x86_64") -> TorchSource:
    """Where torch for `variant` comes from: the default index when the variant is that release's
    default build on this machine (x86_64 and aarch64 defaults differ: torch 2.9's aarch64 wheel on
    the default index is a CPU build), else the PyTorch index of the variant under
    ENVBUILD_PYTORCH_INDEX, the matrix's `pytorch_index` (`root`) or the public PyTorch index.
    `meta`: an index.Metadata (its default_cuda answers which variant is the default)."""
    default = meta.default_cuda(torch_version, machine)
    if default == variant:
        return TorchSource(variant, default, None)
    return TorchSource(variant, default, torch_index_url(pytorch_root(root), variant))


def pytorch_root(matrix_root: str | None = None) -> str:
    """The PyTorch index root in force: ENVBUILD_PYTORCH_INDEX, else the matrix's `pytorch_index`,
    else the public index. The lock and the build (its torch-index secret) both ask here."""
    return pytorch_index_root() or (check_index_url(matrix_root, "pytorch_index", "matrix").rstrip("/")
                                    if matrix_root else PYTORCH_INDEX_DEFAULT)


