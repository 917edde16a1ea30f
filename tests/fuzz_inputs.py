"""Hostile inputs for the fuzz suite (tests/test_fuzz.py) and its longer run (bench/fuzz.py).

Every generator takes a random.Random, so hypothesis drives it in the tests (st.randoms) and a
seed drives it in the bench. A run is judged by Outcome.problems: exit 0/1/2/3, one error line on
stderr when non-zero (after any `warning:` lines), no traceback, inside a time bound, nothing written outside the temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from envbuild.paths import default_matrix

REAL_TEXT = default_matrix().read_text()
REAL = yaml.safe_load(REAL_TEXT)
EXIT_CODES = {0, 1, 2, 3}

# Values a hostile or careless author might put anywhere in a matrix.
HOSTILE_VALUES = [
    "", " ", "0.4.1\n", "0.4.1 ", " 0.4.1", "0.4.1\r", '0.4.1"', "0.4.1'", '"; rm -rf / #', "$(id)", "`id`",
    "../../../x", "/etc/passwd", "a" * 400, "0." + "1" * 400, "1" * 5000, "0.4.1+cu124", "1!2.0", "v1.0", "0.10",
    "cu999", "cu١٢٤", "cu12", "2.35\n", "3.11\n", "3.١١", "é", "\x00", "\u202e", "nvidia/cuda:12.4.1\n",
    "NVIDIA/CUDA", "a:b:c@sha256:" + "0" * 64, ">=2.4,<2.7", ">=2.4\n", "===1", "~=", "*", "==1.*", "!=0.5.2",
    "auto", "hf", "vllm", "sglang", "engine", "true", "null", "~", "<<", "&a", "*a", "!!python/object:os.system",
    10 ** 30, -1, 0, 1, 365, 366, True, False, None, 3.5, 0.1, float("inf"), [], {}, [[["x"]]], {"a": 1},
    ["0.4.1"] * 3, [None], [{}], {"toolkit": "12.4"},
]

# Lines that exercise the YAML loader itself (inserted as raw text).
SNIPPETS = [
    "bomb0: &a0 [x, x, x, x, x, x, x, x, x]\nbomb1: &a1 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]\n"
    "bomb2: [*a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1]\n",
    "x: *undefined\n", "x: &anchor 1\n", "x: !!python/object/apply:os.system [\"true\"]\n", "x: !custom 1\n",
    "x: !!binary aGVsbG8=\n", "x: {<<: {a: 1}}\n", "<<: {schema: 1}\n", "x: " + "[" * 1000 + "]" * 1000 + "\n",
    "x: " + "{a: " * 200 + "1" + "}" * 200 + "\n", "x: " + "[" * 5000 + "\n", "x: 1" + "0" * 5000 + "\n",
    "x: 0x" + "f" * 5000 + "\n", "x: " + ":".join(["59"] * 3000) + "\n", "x: 2024-13-45\n", "? [a, b]\n: 1\n",
    "? {a: 1}\n: 1\n", "---\nschema: 1\n", "%YAML 1.1\n---\n", "x: \"\\ud800\"\n", "x: '\t'\n", "\tx: 1\n",
    "x: [" + ", ".join(["1"] * 30000) + "]\n", "x: " + "a" * 300000 + "\n", "x: |\n" + "  line\n" * 2000,
    "x: \x07\n", "x: =\n", "x: 1e999\n", "x: .nan\n", "schema: 1\nschema: 1\n", "1: x\n", "null: x\n",
    "engines: {vllm: [" + ", ".join(f'"0.{i}"' for i in range(3000)) + "]}\n",
]


def _paths(node, p=()):
    """Every key path in a plain data tree."""
    yield p
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, p + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, p + (i,))


def _get(node, p):
    for k in p:
        node = node[k]
    return node


def _value(rnd: random.Random):
    v = rnd.choice(HOSTILE_VALUES)
    return json.loads(json.dumps(v)) if isinstance(v, (list, dict)) else v  # a fresh copy


def mutate_structure(rnd: random.Random) -> bytes:
    """The real matrix with a few structured mutations, dumped as YAML."""
    data = json.loads(json.dumps(REAL))
    for _ in range(rnd.randint(1, 4)):
        paths = list(_paths(data))
        p = rnd.choice(paths)
        op = rnd.randrange(6)
        if not p:
            if op == 0:
                data = _value(rnd)
                break
            continue
        parent, key = _get(data, p[:-1]), p[-1]
        if op <= 1:  # replace a value
            parent[key] = _value(rnd)
        elif op == 2:  # delete
            del parent[key]
        elif op == 3 and isinstance(parent, dict):  # an unknown or misplaced key
            parent[rnd.choice(["colour", "cuda", "vllm", "engine", "torch", "reason", "include", "python"])] = \
                _value(rnd)
        elif op == 4 and isinstance(parent, list):  # duplicate an item
            parent.append(json.loads(json.dumps(parent[key])))
        else:  # move a subtree somewhere else
            q = rnd.choice(paths)
            if q and q[:len(p)] != p:
                parent[key] = json.loads(json.dumps(_get(data, q)))
        if not isinstance(data, (dict, list)):
            break
    try:
        text = yaml.safe_dump(data, default_flow_style=rnd.choice([None, True, False]), allow_unicode=rnd.random() < .5)
    except (yaml.YAMLError, RecursionError):
        text = REAL_TEXT
    return text.encode("utf-8", "surrogatepass")


def insert_snippet(rnd: random.Random) -> bytes:
    """A YAML-level attack inserted at a random line of the real matrix (or replacing it)."""
    lines = REAL_TEXT.splitlines(keepends=True)
    snippet = rnd.choice(SNIPPETS)
    if rnd.random() < .2:
        return snippet.encode("utf-8", "surrogatepass")
    i = rnd.randrange(len(lines) + 1)
    return "".join(lines[:i] + [snippet] + lines[i:]).encode("utf-8", "surrogatepass")


def flip_bytes(rnd: random.Random) -> bytes:
    """Raw byte damage to the real matrix: flips, inserted bytes, deletions, truncation, encodings."""
    data = bytearray(REAL_TEXT.encode())
    for _ in range(rnd.randint(1, 8)):
        op = rnd.randrange(6)
        i = rnd.randrange(len(data) or 1)
        if op == 0 and data:
            data[i] ^= 1 << rnd.randrange(8)
        elif op == 1:
            data[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        elif op == 2:
            data[i:i] = rnd.choice([b"\n", b" ", b"\t", b":", b"-", b"[", b"{", b"&a ", b"*a", b"!!", b"<<: ", b"'",
                                    b'"', b"#", b"\xff", b"\xc3", b"\x00", b"\xef\xbb\xbf"])
        elif op == 3:
            del data[i:i + rnd.randint(1, 40)]
        elif op == 4:
            del data[i:]
        elif data:  # swap two bytes (an emptied file has none)
            j = rnd.randrange(len(data))
            data[i], data[j] = data[j], data[i]
    if rnd.random() < .05:
        return bytes(data).decode("utf-8", "replace").encode(rnd.choice(["latin-1", "utf-16", "cp1252"]), "replace")
    return bytes(data)


GENERATORS = {"structure": mutate_structure, "snippet": insert_snippet, "bytes": flip_bytes}


# --------------------------------------------------------------------------- running and judging


@dataclass
class Outcome:
    rc: int | None
    stderr: str
    seconds: float
    crash: str = ""  # an exception that escaped the CLI (a traceback)
    hang: bool = False
    writes: list[str] = field(default_factory=list)  # paths written outside the sandbox
    rss_mb: float = 0.0

    def problems(self, max_seconds: float) -> list[str]:
        out = []
        if self.crash:
            out.append(f"traceback: {self.crash}")
        if self.hang or self.seconds > max_seconds:
            out.append(f"hang: {self.seconds:.1f} s")
        if self.rc is not None and self.rc not in EXIT_CODES:
            out.append(f"exit {self.rc}")
        # a warning (e.g. a deprecated key) may come first; the error itself is one line
        errors = [ln for ln in self.stderr.strip().splitlines() if not ln.startswith("warning: ")]
        if self.rc and len(errors) != 1:
            out.append(f"stderr is not one line: {self.stderr[:300]!r}")
        if "Traceback" in self.stderr:
            out.append("traceback on stderr")
        if self.writes:
            out.append(f"wrote outside the sandbox: {self.writes[:3]}")
        return out


class _Deadline(BaseException):
    """Raised by SIGALRM: a BaseException so no `except Exception` in the code under test eats it."""


_WRITE_EVENTS = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.symlink", "os.link",
                 "os.truncate", "os.chmod", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
_guard: dict = {"root": None, "writes": None}


def _audit(event, args):
    root = _guard["root"]
    if root is None:
        return
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
        paths = [path] if writing else []
    elif event in _WRITE_EVENTS:
        paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
    else:
        return
    for p in paths:
        if isinstance(p, int):
            continue
        p = os.fsdecode(p)
        full = os.path.realpath(os.path.join(os.getcwd(), p))
        inside = full == root or full.startswith(root + os.sep)
        if not inside and not full.startswith("/dev/") and "__pycache__" not in full:  # Python's own .pyc
            _guard["writes"].append(full)


_hook_installed = False


@contextlib.contextmanager
def guard(root: Path):
    """Record (in the yielded list) every write outside `root` made inside the block."""
    global _hook_installed
    if not _hook_installed:  # an audit hook cannot be removed: install one, switch it per block
        sys.addaudithook(_audit)
        _hook_installed = True
    writes: list[str] = []
    _guard.update(root=os.path.realpath(root), writes=writes)
    try:
        yield writes
    finally:
        _guard.update(root=None, writes=None)


def sandbox_env(root: Path) -> dict[str, str]:
    """Environment of a fuzz run: caches and state inside `root`, an index that refuses at once."""
    return {"HOME": str(root / "home"), "ENVBUILD_CACHE": str(root / "cache"), "XDG_CACHE_HOME": str(root / "xdg"),
            "XDG_STATE_HOME": str(root / "xdg-state"), "XDG_CONFIG_HOME": str(root / "xdg-config"),
            "UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "ENVBUILD_PYTORCH_INDEX": "http://127.0.0.1:9/whl"}


def run_inprocess(argv: list[str], root: Path, max_seconds: float) -> Outcome:
    """envbuild.cli.main(argv) in this process, cwd and caches in `root`, a SIGALRM deadline and an
    audit hook that records every write outside `root`."""
    from envbuild.cli import main
    from envbuild.index_config import default_index_url

    env = sandbox_env(root)
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cwd = os.getcwd()
    os.environ.update(env)
    default_index_url.cache_clear()
    err, out = io.StringIO(), io.StringIO()
    rc, crash, hang = None, "", False

    def alarm(*_):
        raise _Deadline()

    old = signal.signal(signal.SIGALRM, alarm)
    os.chdir(root)
    t0 = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, max_seconds)
        with guard(root) as writes, contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except _Deadline:
        hang = True
    except BaseException as e:  # noqa: BLE001 - exactly what the fuzz looks for
        tb = traceback.extract_tb(e.__traceback__)[-1]
        crash = f"{type(e).__name__}: {str(e)[:200]} ({Path(tb.filename).name}:{tb.lineno})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        seconds = time.monotonic() - t0
        signal.signal(signal.SIGALRM, old)
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        default_index_url.cache_clear()
    return Outcome(rc, err.getvalue(), seconds, crash, hang, writes)


# The child installs the same audit hook, then runs the real entry point.
_CHILD = """
import os, sys
sys.path.insert(0, {tests!r})
import fuzz_inputs
root = os.path.realpath(os.getcwd())
fuzz_inputs._guard.update(root=root, writes=[])
sys.addaudithook(fuzz_inputs._audit)
from envbuild.cli import main
try:
    rc = main(sys.argv[1:])
finally:
    w = fuzz_inputs._guard["writes"]
    fuzz_inputs._guard["root"] = None
    if w:
        open(os.path.join(root, "writes.json"), "w").write(__import__("json").dumps(w))
    import resource
    open(os.path.join(root, "rss_kb"), "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
sys.exit(rc)
"""


def run_subprocess(argv: list[str], root: Path, max_seconds: float, max_mb: int = 1024) -> Outcome:
    """The real entry point in a child process under an address-space limit and a timeout;
    returns the child's peak RSS too."""
    import resource
    import subprocess

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (max_mb << 20, max_mb << 20))

    code = _CHILD.format(tests=str(Path(__file__).resolve().parent))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=root, env={**os.environ, **sandbox_env(root)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limits)
    hang = False
    try:
        _, stderr = proc.communicate(timeout=max_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        hang = True
    seconds = time.monotonic() - t0
    rss_mb = 0.0
    with contextlib.suppress(OSError, ValueError):  # the child's own peak RSS (absent if it was killed)
        rss_mb = int((root / "rss_kb").read_text()) / 1024
    text = stderr.decode("utf-8", "replace")
    wfile = root / "writes.json"
    writes = json.loads(wfile.read_text()) if wfile.exists() else []
    crash = text.strip().splitlines()[-1][:200] if "Traceback" in text else ""
    return Outcome(None if hang else proc.returncode, text, seconds, crash, hang, writes, rss_mb)


# --------------------------------------------------------------------------- records


def garbage_record(rnd: random.Random) -> bytes:
    """A file where a result record would be: damaged records, other JSON, not JSON at all."""
    good = {"schema": 1, "run_id": "20260101T000000-abcdef", "created": "2026-01-01T00:00:00Z",
            "combo": {"id": "verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11"}, "stage": "probe", "status": "ok",
            "probe": {}, "timings": {}, "machine": {}}
    kind = rnd.randrange(5)
    if kind == 0:  # a record with one field replaced by a hostile value
        d = dict(good)
        d[rnd.choice(list(good) + ["extra"])] = _value(rnd)
        return json.dumps(d).encode()
    if kind == 1:  # any JSON value
        return json.dumps(_value(rnd)).encode()
    if kind == 2:  # truncated or byte-flipped
        b = bytearray(json.dumps(good).encode())
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        return bytes(b[:rnd.randrange(len(b) + 1)])
    if kind == 3:
        return bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 64)))
    return b"[" * rnd.choice([10, 100_000]) + b"]" * rnd.choice([0, 10])
