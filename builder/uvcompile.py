"""One `uv pip compile` and what its messages mean: the resolver as envbuild runs it (lock.Locker
resolves whole stacks with it; this module knows uv, not stacks).

An unreachable index is infrastructure, never a verdict; a "no solution" is `unsatisfiable`;
uv answering from its cache alone is infrastructure too. uv runs behind a launcher that has the
kernel end it with envbuild, and index URLs (which may carry credentials) reach it through its
environment only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .errors import InfraError
from .index_config import default_index_url, redact, uv_exe

# uv's messages -> our classes. An unreachable index is infrastructure, never a verdict.
_NET_RE = re.compile(r"(error sending request|Could not connect|connection (refused|reset)|dns error|"
                     r"timed out|Failed to fetch|failed to lookup address|tls|certificate|"
                     r"Network unreachable|HTTP status server error|status code 5\d\d)", re.I)
# uv answering from its cache alone ("the network was disabled", UV_OFFLINE=1, --offline): a "no
# solution" then says what the cache lacks, not what the index holds. Infrastructure, never cached.
_OFFLINE_RE = re.compile(r"network (?:was|is) disabled|offline mode|--offline", re.I)
# uv refusing a release that a dependency pins exactly but that was yanked afterwards ("Because
# futures==3.1.1 was yanked (reason: ...) and pkg==5.0.1 depends on futures==3.1.1"). pip
# installs such a pin with a warning; uv only when it is asked for directly.
YANKED_RE = re.compile(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+!\-]+?),? (?:was yanked|is unusable because it was yanked)"
                        r"(?: \(reason: ([^)]*)\))?")
PINNED_BY_RE = (r"(?:([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+!\-]+)|all versions of ([A-Za-z0-9_.\-]+)) depends? on "
                 r"{name}==\s*{version}\b")
# uv's hint when the era cutoff hid what a requirement needs.
FILTERED_RE = re.compile(r"`([A-Za-z0-9_.\-]+)` was filtered by `exclude-newer(?:-package)?` to only include packages uploaded "
                          r"before [^.]*\.(?: The latest version satisfying the requirement is v?(\S+), published "
                          r"at (\d{4}-\d\d-\d\d))?")


def uv_version() -> str:
    out = subprocess.run([uv_exe(), "--version"], capture_output=True, text=True)
    return out.stdout.strip()


def compile_requirements(reqs: list[str], when: str, python: str, platform: str, torch_index: str | None,
                         lifts: dict[str, str], workdir: str | os.PathLike, hashes: bool = True,
                         fmt: str = "requirements", on_argv=None, engine_index: str | None = None) -> dict:
    """One `uv pip compile` -> {"status", "text"}: `platform` as uv's --python-platform, the era
    `when` as --exclude-newer, `lifts` as per-package cutoffs, `torch_index` searched first, then
    the engine's own index (vocab.EngineSpec.extra_index), then the configured one.
    Index URLs go through uv's environment, never its argv (on_argv sees the argv). uv runs in
    `workdir` (the caller's scratch folder, swept after a kill -9)."""
    env = {k: v for k, v in os.environ.items() if k not in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL")}
    env["UV_NO_PROGRESS"] = "1"
    try:
        env["UV_DEFAULT_INDEX"] = default_index_url()
    except InfraError as e:
        return {"status": e.cause, "text": e.message}
    inp = Path(workdir) / "requirements.in"
    outp = Path(workdir) / ("pylock.toml" if fmt == "pylock" else "requirements.txt")
    inp.write_text("\n".join(reqs) + "\n")
    # Relative names, run in the folder: uv's `# via -r requirements.in` is then the
    # same bytes in every run (the full lock's hash must not depend on a temp path).
    cmd = [uv_exe(), "pip", "compile", inp.name, "-o", outp.name, "--no-header",
           "--python-version", python, "--python-platform", platform, "--quiet"]
    cmd += ["--generate-hashes"] if hashes else []
    cmd += ["--format", "pylock.toml"] if fmt == "pylock" else []
    cmd += ["--exclude-newer", when] if when else []
    for name, date in sorted(lifts.items()):
        cmd += ["--exclude-newer-package", f"{name}={date}"]
    if engine_index:  # the engine's wheels: searched before the default index, best match across both
        env["UV_INDEX"] = " ".join(x for x in (engine_index, os.environ.get("UV_INDEX", "")) if x)
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    if torch_index:
        # Searched before the default index. Its pages carry no upload times, which the
        # cutoff would take for "too new": torch (pinned by version and variant) is exempt,
        # and every other package is taken from whichever index has the best match.
        env["UV_INDEX"] = " ".join(x for x in (torch_index, env.get("UV_INDEX", "")) if x)
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
        cmd += ["--exclude-newer-package", "torch=false"] if when else []
    if on_argv is not None:
        on_argv(cmd)
    try:
        p = subprocess.run([*_DIE_WITH_PARENT, *cmd], capture_output=True, text=True, timeout=900,
                           env=env, cwd=workdir)
    except subprocess.TimeoutExpired:
        return {"status": "index-unreachable", "text": "uv pip compile timed out after 900 s"}
    if p.returncode == 0:
        return {"status": "ok", "text": outp.read_text()}
    err = p.stderr.strip()
    if _OFFLINE_RE.search(err) or env.get("UV_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        status = "index-unreachable"
        err = "the resolver is offline (UV_OFFLINE or a cache-only answer): not a verdict\n" + err
    elif "No solution found" in err:
        status = "unsatisfiable"
    elif _NET_RE.search(err):
        status = "index-unreachable"
    else:
        status = "lock-error"
    return {"status": status, "text": err[-20000:]}


def name_re(name: str) -> re.Pattern:
    """A distribution name as uv may spell it (any of - _ . between its words, any case)."""
    return re.compile(r"(?<![A-Za-z0-9_.\-])" + r"[-_.]+".join(map(re.escape, re.split(r"[-_.]+", name)))
                      + r"(?![A-Za-z0-9_\-])", re.I)


def unreachable_hint(text: str, src) -> str:
    """One first line that names the index that did not answer and the fix, above uv's words."""
    if src is not None and src.url and redact(src.url) in redact(text):
        head = (f"the PyTorch index {redact(src.url)} did not answer: set ENVBUILD_PYTORCH_INDEX (or "
                "`pytorch_index:` in the matrix) to a mirror that serves it")
    elif "timed out" in text and "uv pip compile" in text:
        head = "the resolver timed out against the package index"
    else:
        head = "the package index did not answer: check the index pip/uv use (UV_DEFAULT_INDEX, PIP_INDEX_URL) and the proxy"
    return head + "\n" + text


# uv runs behind a one-line launcher that asks the kernel to SIGKILL it when envbuild dies (a kill
# -9 of `envbuild lock` left uv running, the credentialed index URLs in its environment); a
# launcher, not preexec_fn, because locks resolve in threads.
_DIE_WITH_PARENT = [sys.executable, "-c", "import ctypes,os,sys\ntry:\n ctypes.CDLL(None).prctl(1, 9)\n"
                    "except (OSError, AttributeError):\n pass\nos.execvp(sys.argv[1], sys.argv[1:])"]
