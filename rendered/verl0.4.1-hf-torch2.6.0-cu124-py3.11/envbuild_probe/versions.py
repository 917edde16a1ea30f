"""A small PEP 440 comparator (the probe runs where `packaging` may be missing).

Enough for the ranges the contract checks state: release numbers, pre/dev/post releases and
local labels ('2.6.0+cu124' compares as 2.6.0). Specifiers: '>=0.7, <0.12', '==0.8.*', '!=0.9.1'.
"""

from __future__ import annotations

import re

_VER = re.compile(
    r"v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pren>\d*))?"
    r"(?:-(?P<postn1>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<postn2>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<devn>\d*))?"
    r"(?:\+[a-z0-9.\-_]+)?", re.I)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def parse(v: str) -> tuple:
    """A sort key: (epoch, release padded, pre, post, dev). Raises ValueError on nonsense."""
    m = _VER.fullmatch(str(v).strip())
    if not m:
        raise ValueError(f"not a version: {v!r}")
    rel = [int(x) for x in m["release"].split(".")]
    while len(rel) > 1 and rel[-1] == 0:
        rel.pop()
    inf = float("inf")
    dev = int(m["devn"] or 0) if m["devn"] is not None else inf
    if m["pre"]:
        pre = (_PRE[m["pre"].lower()], int(m["pren"] or 0))
    elif m["devn"] is not None and m["postn1"] is None and m["postn2"] is None:
        pre = (-1, 0)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (inf, 0)
    post_s = m["postn1"] if m["postn1"] is not None else m["postn2"]
    post = int(post_s or 0) if post_s is not None else -1
    return (int(m["epoch"] or 0), tuple(rel), pre, post, dev)


def _release(v: str) -> list[int]:
    m = _VER.fullmatch(str(v).strip())
    return [int(x) for x in m["release"].split(".")] if m else []


def _one(seen: str, spec: str) -> bool:
    m = re.fullmatch(r"\s*(===|==|!=|<=|>=|~=|<|>)\s*([^\s,]+)\s*", spec)
    if not m:
        raise ValueError(f"not a version specifier: {spec!r}")
    op, want = m.groups()
    if op in ("==", "!=") and want.endswith(".*"):
        prefix = _release(want[:-2])
        ok = _release(seen)[:len(prefix)] == prefix
        return ok if op == "==" else not ok
    a, b = parse(seen), parse(want)
    if op == "~=":
        rel = _release(want)
        return a >= b and _release(seen)[:len(rel) - 1] == rel[:-1]
    return {"==": a == b, "===": a == b, "!=": a != b, "<=": a <= b, ">=": a >= b, "<": a < b, ">": a > b}[op]


def satisfies(seen: str | None, specifier: str) -> bool:
    """Does version `seen` satisfy every comma-separated clause of `specifier`? None never does."""
    if seen is None:
        return False
    return all(_one(seen, s) for s in specifier.split(",") if s.strip())
