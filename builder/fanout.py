"""Probes fanned out over a Ray cluster (`envbuild probe --ray ADDRESS [selectors]`).

verl users already run Ray. One Ray task per image asks for one GPU, runs the probe in a
container on the node it lands on (envbuild.probe_run.probe_image_levels: all levels in one
container) and returns the verdicts;
the driver writes each result into the results folder as a record (envbuild.record) the
moment it arrives. A task whose worker or node is lost mid-probe is retried on another node
(Ray's label selector keeps it off the nodes where it was lost) a bounded number of times,
and then recorded as status "error" (infrastructure), never as a broken combination.

The images are the ones the results folder records for the selected combinations (the
newest record with an image: its registry digest when pushed, so any node can pull it).
Running a probe and writing its record is envbuild.probe_run's, shared with `envbuild build`,
`envbuild ci probe` and `envbuild probe`: this module keeps only the Ray code.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .docker import Engine
from .errors import EnvbuildError, InfraError, InputError
from .expand import plan_from_args
from .outcome import RECORD_ERROR, Verdict, exit_of_records, unwritten
from .probe.vocab import ERROR
from .probe_exec import DEFAULT_TIMEOUT
from .probe_run import CONTAINER_PREFIX, ProbeJob, jobs_from_results, probe_levels, record_probe
from .selector import add_selector_args

DEFAULT_RETRIES = 2
RETRIABLE_VERDICT_CAUSES = ("docker-error", "no-docker")  # the node, not the stack


@dataclass
class Attempt:
    node: str | None  # Ray node id (None: not known, the task never started)
    host: str | None
    outcome: str  # "verdict" | "lost" | "error"
    detail: str = ""


@dataclass
class Outcome:
    job: ProbeJob
    verdicts: dict = field(default_factory=dict)  # level -> verdict
    attempts: list[Attempt] = field(default_factory=list)
    machine: dict = field(default_factory=dict)


def write_outcome(results: str | os.PathLike, o: Outcome):
    """The record of one job after its attempts; lost attempts are named, never a verdict."""
    lost = [a for a in o.attempts if a.outcome != "verdict"]
    if not o.verdicts:
        detail = (f"no verdict after {len(o.attempts)} attempt(s); each lost its worker or node "
                  "(infrastructure, not a verdict on the stack): ")
        detail += "; ".join(f"#{i + 1} on {a.node or '?'} ({a.host or '?'}): {a.detail}" for i, a in enumerate(o.attempts))
        return record_probe(results, o.job, {}, machine=o.machine, extra_detail=detail, status=RECORD_ERROR,
                            cause="node-lost")
    extra = ""
    if lost:
        extra = f"verdict on attempt {len(o.attempts)}; earlier attempts lost: " + \
            "; ".join(f"{a.node or '?'}: {a.detail}" for a in lost)
    return record_probe(results, o.job, o.verdicts, machine=o.machine, extra_detail=extra)


# ---------------------------------------------------------------- the Ray task


def _cleanup_orphans(image: str) -> None:
    """Remove probe containers of this image left by an attempt whose worker was killed (its
    docker client died with it; the container did not). One task per image per run, so a
    probe container of this image on this node is an orphan."""
    Engine.for_containers().remove_containers(CONTAINER_PREFIX, image)


def _task_body(job: ProbeJob, levels: list[str], timeout: float | None, tracker, key: str) -> dict:
    import ray

    node = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    if tracker is not None:
        ray.get(tracker.started.remote(key, node, host))
    _cleanup_orphans(job.ref)
    # The verdicts cross to the driver as the probe's JSON; the driver types them (Verdict.of).
    verdicts = {lv: v.to_dict() for lv, v in probe_levels(job.target(), levels, timeout=timeout).items()}
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"node": node, "host": host, "verdicts": verdicts,
            "machine": {"hostname": host, "platform": platform.platform(), "ray_node": node,
                        "gpu": {"CUDA_VISIBLE_DEVICES": gpu} if gpu else None}}


class _Tracker:
    """Where each attempt started: the driver cannot ask a dead worker."""

    def __init__(self):
        self.where: dict[str, tuple[str, str]] = {}

    def started(self, key: str, node: str, host: str) -> None:
        self.where[key] = (node, host)

    def get(self, key: str):
        return self.where.get(key)


# ---------------------------------------------------------------- the driver


def _package_copy() -> str:
    """This envbuild as a folder named `envbuild` for Ray's py_modules: nodes without envbuild
    installed get the same code (the package lives in builder/, imported as envbuild)."""
    import shutil
    import tempfile

    src = Path(__file__).resolve().parent
    dst = Path(tempfile.mkdtemp(prefix="envbuild-ray-")) / "envbuild"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return str(dst)


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail in seconds, not minutes: ray.init retries an unreachable head for a long time."""
    hostport = address.split("://")[-1]
    if ":" not in hostport:
        return  # "auto" and friends: Ray finds the address itself
    host, port = hostport.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise InfraError("ray-unreachable", f"no Ray head answers at {address}: {e}") from None


def fan_out(address: str, jobs: list[ProbeJob], levels: list[str], results: str | os.PathLike, *,
            timeout: float | None = None, retries: int = DEFAULT_RETRIES, gpus: float = 1.0,
            ship_code: bool = True, say=print, deadline_s: float | None = None) -> list:
    """Probe every job on the cluster; write each record as it arrives. Returns the records."""
    _check_reachable(address)
    kw = {}
    host = address.split("://")[-1].rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost"):
        # A local cluster: talk to it over loopback only. Ray otherwise swaps 127.0.0.1 for this
        # machine's outward address; this switch (read when ray is imported) keeps loopback.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        kw["_node_ip_address"] = "127.0.0.1"
    try:
        import ray
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError
    except ImportError:
        raise EnvbuildError("--ray needs Ray installed (pip install 'ray[default]')") from None

    shipped = _package_copy() if ship_code else None
    runtime_env = {"py_modules": [shipped]} if shipped else None
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="WARNING",
                 configure_logging=True, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        if shipped:
            import shutil

            shutil.rmtree(Path(shipped).parent, ignore_errors=True)
        raise InfraError("ray-unreachable", f"cannot join the Ray cluster at {address}: {e}") from None
    records = []
    try:
        total_gpus = ray.cluster_resources().get("GPU", 0)
        if total_gpus < gpus:
            raise InfraError("no-gpu-nodes", f"the Ray cluster at {address} has {total_gpus:g} GPU(s); "
                                             f"each probe asks for {gpus:g}")
        # The tracker lives on the head node: losing that loses the cluster anyway, while a
        # tracker on a worker node would die with the very node it has to report on.
        tracker = ray.remote(_Tracker).options(num_cpus=0, resources={"node:__internal_head__": 0.001}).remote()

        def where_started(key: str) -> tuple:
            try:
                return ray.get(tracker.get.remote(key), timeout=30) or (None, None)
            except (RayError, GetTimeoutError):
                return (None, None)

        task = ray.remote(_task_body)
        per_level = float(timeout) if timeout else None
        # Never wait forever on a task (a hung raylet): the probe's own timeout plus slack.
        budget = deadline_s or sum((per_level or DEFAULT_TIMEOUT[lv]) for lv in levels) + 300

        outcomes = [Outcome(j) for j in jobs]
        lost_nodes: dict[int, list[str]] = {i: [] for i in range(len(jobs))}
        pending: dict = {}

        def submit(i: int) -> None:
            key = f"{i}:{len(outcomes[i].attempts)}"
            opts = {"num_gpus": gpus, "num_cpus": 0, "max_retries": 0}  # retries are ours: elsewhere
            if lost_nodes[i]:  # elsewhere: not on a node where this probe was lost
                opts["label_selector"] = {"ray.io/node-id": f"!in({','.join(lost_nodes[i])})"}
            ref = task.options(**opts).remote(jobs[i], levels, per_level, tracker, key)
            pending[ref] = (i, key, time.monotonic())

        for i in range(len(jobs)):
            submit(i)
        say(f"ray {address}: {len(jobs)} probe task(s) ({', '.join(levels)}), "
            f"{total_gpus:g} GPU(s) in the cluster, up to {retries} retr{'y' if retries == 1 else 'ies'} each")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=2.0)
            now = time.monotonic()
            for ref in list(pending):
                if ref not in ready and now - pending[ref][2] > budget:
                    ray.cancel(ref, force=True)  # surfaces below as a lost attempt
            for ref in ready:
                i, key, _t0 = pending.pop(ref)
                o = outcomes[i]
                try:
                    res = ray.get(ref, timeout=60)
                except RayTaskError as e:  # our code raised: a bug, not a node; no retry
                    where = where_started(key)
                    o.attempts.append(Attempt(where[0], where[1], "error", str(e).splitlines()[-1][:500]))
                    o.verdicts = {levels[0]: Verdict.of(unwritten(levels[0], jobs[i].combo.get("engine"),
                                                                  jobs[i].target().expect, ERROR, "probe-crash",
                                                                  str(e)), levels[0])}
                    records.append(_done(results, o, say))
                    continue
                except (RayError, GetTimeoutError) as e:
                    where = where_started(key)
                    o.attempts.append(Attempt(where[0], where[1], "lost", type(e).__name__ + ": " +
                                              (str(e).strip().splitlines() or [""])[0][:300]))
                    if where[0]:
                        lost_nodes[i].append(where[0])
                    if len(o.attempts) <= retries:
                        say(f"  {jobs[i].combo['id']}: lost on {where[1] or '?'} ({type(e).__name__}); "
                            f"retry {len(o.attempts)}/{retries} elsewhere")
                        submit(i)
                    else:
                        records.append(_done(results, o, say))
                    continue
                got = {lv: Verdict.of(v, lv) for lv, v in res["verdicts"].items()}
                bad_node = next((v for v in got.values()
                                 if v.status == ERROR and v.cause in RETRIABLE_VERDICT_CAUSES), None)
                if bad_node is not None and len(o.attempts) < retries:
                    o.attempts.append(Attempt(res["node"], res["host"], "error", bad_node.cause))
                    lost_nodes[i].append(res["node"])
                    say(f"  {jobs[i].combo['id']}: {bad_node.cause} on {res['host']}; retry elsewhere")
                    submit(i)
                    continue
                o.attempts.append(Attempt(res["node"], res["host"], "verdict"))
                o.verdicts, o.machine = got, res["machine"]
                records.append(_done(results, o, say))
    finally:
        ray.shutdown()
        if shipped:
            import shutil

            shutil.rmtree(Path(shipped).parent, ignore_errors=True)
    return records


def _done(results, o: Outcome, say):
    rec = write_outcome(results, o)
    levels = ", ".join(f"{lv} {v.status}" for lv, v in o.verdicts.items()) or "no verdict"
    say(f"  {o.job.combo['id']}: {rec.status} ({levels}){' cause ' + rec.cause if rec.cause else ''}"
        f" after {len(o.attempts)} attempt(s) -> records/{o.job.combo['id']}/{rec.run_id}.json")
    return rec


# ---------------------------------------------------------------- CLI glue


def run_from_args(args) -> int:
    """`envbuild probe --ray ADDRESS [selectors]` (the hook in probe_cmd calls this)."""
    results = Path(getattr(args, "results", None) or "results")
    if not results.is_dir():
        raise InputError(str(results), None, "--results", str(results), "no such directory (build first)")
    pl = plan_from_args(args)
    jobs, missing = jobs_from_results(results, pl.combos)
    for cid in missing:
        print(f"  {cid}: no image recorded in {results}; build it first", file=sys.stderr)
    if not jobs:
        raise EnvbuildError(f"none of the {len(pl.combos)} selected combination(s) has an image in {results}")
    level = getattr(args, "level", None) or "contract"
    recs = fan_out(args.ray, jobs, [level], results, timeout=getattr(args, "timeout", None),
                   retries=getattr(args, "retries", DEFAULT_RETRIES))
    return exit_of_records([r.status for r in recs], incomplete=bool(missing))


def add_ray_arguments(p) -> None:
    """The options `envbuild probe` gains for --ray (selectors pick the combinations)."""
    g = p.add_argument_group("Ray fan-out (--ray) and selectors")
    g.add_argument("--ray", metavar="ADDRESS",
                   help="probe the selected combinations' images on this Ray cluster, one GPU task per image")
    g.add_argument("--results", default=None, help="results folder: with --ray, the images to probe and the records "
                                                  "written (default ./results); with --here, where a materialized "
                                                  "row's in-place record goes (envbuild venv)")
    g.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                   help=f"retries on another node when a node or worker is lost (default {DEFAULT_RETRIES})")
    add_selector_args(g)
