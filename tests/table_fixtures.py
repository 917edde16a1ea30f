"""Constructed result records for the table/pick/page tests (unit-test inputs, not results)."""

from __future__ import annotations

import hashlib
import itertools

from envbuild.record import Record, write_record

REGISTRY = "127.0.0.1:5000/envbuild"
_seq = itertools.count()


def combo(verl="0.4.1", engine="vllm", ev="0.8.4", torch="2.6.0", cuda="cu124", python="3.11",
          platform="linux/amd64") -> dict:
    """A combination as records hold it (values.Combo.to_dict: the variant as its tag, cu124)."""
    from envbuild.values import Combo
    from envbuild.probe.hardware import variant_tag

    return Combo(verl, engine, ev, torch, variant_tag(cuda) or cuda, python, platform=platform).to_dict()


def image(c: dict, build: int = 0, pushed: bool = True) -> dict:
    h = hashlib.sha256(f"{c['id']}#{build}".encode()).hexdigest()
    img = {"ref": f"{REGISTRY}:{c['id']}", "id": "sha256:" + h[::-1], "content_hash": h[:16], "size": 123}
    if pushed:
        img["digest"] = f"{REGISTRY}@sha256:{h}"
    return img


def verdict(status: str, cause: str | None = None, detail: str = "") -> dict:
    v = {"status": status, "checks": []}
    if status != "pass":
        v["checks"].append({"name": "import verl.workers.rollout", "status": status, "cause": cause,
                            "detail": detail})
        v["cause"] = cause
    return v


def rec(c: dict, probe: dict | None = None, *, img=None, stage="probe", status="ok", cause=None,
        detail="", run: int | None = None, machine=None) -> Record:
    """A record; `run` orders records (larger = newer)."""
    n = next(_seq) if run is None else run
    # a record with an image is the pipeline's (it rendered and built the image) unless told
    # otherwise: fold counts a probe-only record only for an image such a record made
    return Record(combo=c, stage=stage, status=status, cause=cause, detail=detail, image=img,
                  probe=probe or {}, machine=machine or {"hostname": "test"},
                  timings={"render": 0.1, "build": 1.0} if img else {},
                  run_id=f"20261201T{n:06d}-abcdef", created=f"2026-12-01T00:00:{n % 60:02d}Z",
                  lock_hash="ab" * 32)


def passed(*levels) -> dict:
    return {lv: verdict("pass") for lv in levels}


def write_all(results, records) -> None:
    for r in records:
        write_record(results, r)
