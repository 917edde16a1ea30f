"""Fuzz (issue 14): hostile matrices and record folders never crash envbuild.

Property, through the real `envbuild plan --matrix FILE` path: exit 0, 1, 2 or 3; on a non-zero
exit one line on stderr and no traceback; each run within a time bound and the process within a
memory bound; nothing written outside the run's temporary folder (an audit hook sees every
write). Inputs: structured mutations of matrix/verl.yaml, YAML attacks inserted into it, raw byte
damage (tests/fuzz_inputs.py). Derandomized and without an example database, so CI sees the same
inputs every run and the suite writes nothing into the checkout; bench/fuzz.py runs the same
generators for longer.
"""

import json
import os
import random
import re
import resource
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz_inputs import GENERATORS, garbage_record, guard, run_inprocess, run_subprocess

from envbuild.record import iter_records, latest_by_combo

MAX_SECONDS = 10.0  # a clean run takes ~0.05 s; the bound catches hangs, not slowness
MAX_GROWTH_MB = 500  # the reported alias bomb took 6.4 GB
_BASELINE_KB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _status_kb(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def _peak_start() -> int | None:
    """Reset this process's peak RSS to its present RSS (Linux: clear_refs 5) and return that RSS
    in kB, so the peak read after one plan is that plan's, not the pytest run's so far (a test
    earlier in the same process once set it 610 MB higher); None where it cannot be reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kb("VmRSS")
    except (OSError, AttributeError):
        return None


def _grown_mb(start_kb: int | None) -> float:
    if start_kb is None:  # the process's peak since this module was imported: an upper bound
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - _BASELINE_KB) / 1024
    return (_status_kb("VmHWM") - start_kb) / 1024

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _argv(rnd: random.Random, path: Path) -> list[str]:
    extra = rnd.choice([[], ["--json"], ["--all"], ["--json", "--all"], ["--cuda", "cu124"], ["--hf"]])
    return ["plan", "--matrix", str(path), *extra]


@FUZZ
@given(kind=st.sampled_from(sorted(GENERATORS)), rnd=st.randoms(use_true_random=False))
def test_plan_on_a_hostile_matrix_exits_cleanly(kind, rnd):
    with tempfile.TemporaryDirectory(prefix="envbuild-fuzz-") as d:
        root = Path(d)
        path = root / "m.yaml"
        path.write_bytes(GENERATORS[kind](rnd))
        start = _peak_start()
        out = run_inprocess(_argv(rnd, path), root, MAX_SECONDS)
        grown = _grown_mb(start)
    assert not out.problems(MAX_SECONDS), (kind, out.problems(MAX_SECONDS), out.stderr[:300])
    assert grown < MAX_GROWTH_MB, f"peak memory grew by {grown:.0f} MB"


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(kind=st.sampled_from(sorted(GENERATORS)), rnd=st.randoms(use_true_random=False))
def test_a_sample_as_a_real_process_under_memory_and_time_limits(kind, rnd):
    with tempfile.TemporaryDirectory(prefix="envbuild-fuzz-") as d:
        root = Path(d)
        path = root / "m.yaml"
        path.write_bytes(GENERATORS[kind](rnd))
        out = run_subprocess(_argv(rnd, path), root, max_seconds=60, max_mb=1024)
    assert not out.problems(60), (kind, out.problems(60), out.stderr[:300])


def test_the_sandbox_sees_a_write_outside_it(tmp_path):
    """The 'nothing written outside' check can fail: a write elsewhere is reported, one inside is not."""
    (tmp_path / "root").mkdir()
    with guard(tmp_path / "root") as writes:
        (tmp_path / "outside.txt").write_text("x")
        (tmp_path / "root" / "inside.txt").write_text("y")
        (tmp_path / "root" / "inside.txt").replace(tmp_path / "moved.txt")
    assert writes == [os.path.realpath(tmp_path / "outside.txt"), os.path.realpath(tmp_path / "moved.txt")]


def _records_dir(root: Path, files: list[bytes]) -> Path:
    for i, data in enumerate(files):
        d = root / "records" / f"combo{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"2026010{i % 9}T000000-{i:06x}.json").write_bytes(data)
    return root


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(rnd=st.randoms(use_true_random=False), n=st.integers(1, 6))
def test_record_reader_skips_json_garbage(rnd, n):
    """Damaged records and other JSON where records live: iter_records yields or skips, never raises."""
    with tempfile.TemporaryDirectory(prefix="envbuild-fuzz-") as d:
        list(iter_records(_records_dir(Path(d), [_json_garbage(rnd) for _ in range(n)])))


def _json_garbage(rnd: random.Random) -> bytes:
    while True:
        b = garbage_record(rnd)
        try:
            json.loads(b)
            return b
        except (ValueError, RecursionError):
            continue


@settings(max_examples=30, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
@given(rnd=st.randoms(use_true_random=False), n=st.integers(1, 6))
def test_record_reader_survives_any_bytes(rnd, n):
    with tempfile.TemporaryDirectory(prefix="envbuild-fuzz-") as d:
        root = _records_dir(Path(d), [garbage_record(rnd) for _ in range(n)])
        list(iter_records(root))
        latest_by_combo(root)


def test_a_hostile_registry_behind_verify_is_always_one_clean_error(tmp_path):
    """Issue 27: wrong shapes, wrong digests, bad statuses and broken HTTP framing from the
    registry end as a trust failure or infrastructure, within seconds (bench/fuzz.py runs more)."""
    from fuzz_registry import verify_against

    from envbuild.sign import write_keypair
    pub = write_keypair(tmp_path / "k")[1]
    seen: dict[str, int] = {}
    for i in range(60):
        out, seconds = verify_against(f"test-{i}", pub, deadline=10)
        assert not out.startswith("CRASH"), (i, out)
        assert seconds < 15, (i, seconds)
        seen[out] = seen.get(out, 0) + 1
    assert seen.get("verify") and seen.get("infra")  # both kinds of answer were provoked
