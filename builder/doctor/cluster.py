"""doctor, ray group: the Ray cluster and its GPUs, the rollout engine's fixed ports."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

from ..verl_config import VerlConfig
from ..probe.vocab import ENGINE, engine_of_rollout
from .common import (FAIL, PASS, SKIP, Options, Result, _num)


def ray_address(cfg: VerlConfig) -> tuple[str | None, str]:
    for key in ("ray_kwargs.ray_init.address", "ray_init.address"):
        v = cfg.get(key)
        if v:
            return str(v), key
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None, ""


_RAY_QUERY = r"""
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
nodes = [{"ip": n.get("NodeManagerAddress"), "gpus": n.get("Resources", {}).get("GPU", 0)}
         for n in ray.nodes() if n.get("Alive")]
print("ENVBUILD-RAY " + json.dumps({"version": ray.__version__, "nodes": nodes,
                                    "gpus": ray.cluster_resources().get("GPU", 0)}))
ray.shutdown()
"""


def check_ray(cfg: VerlConfig, opt: Options) -> list[Result]:
    out: list[Result] = []
    nnodes = _num(cfg, "trainer.nnodes", 1)
    per_node = _num(cfg, "trainer.n_gpus_per_node", 0)
    want = f"trainer.nnodes={nnodes} x n_gpus_per_node={per_node}"
    addr, src = ray_address(cfg)
    if not addr or addr == "local":
        if nnodes > 1:
            out.append(Result("ray", "ray.cluster", FAIL,
                              f"{want} but no Ray address: verl would start a one-machine Ray instance",
                              "start the cluster and set +ray_kwargs.ray_init.address=HOST:PORT (verl <= 0.4: "
                              "+ray_init.address) or RAY_ADDRESS"))
        else:
            out.append(Result("ray", "ray.cluster", SKIP, "no Ray address configured: verl starts Ray on this machine"))
    else:
        out.append(_query_ray(addr, src, nnodes, per_node, want, opt))
    out.append(check_rollout_ports(cfg))
    return out


def _query_ray(addr: str, src: str, nnodes: int, per_node: int, want: str, opt: Options) -> Result:
    m = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", addr)
    if m:  # fail fast when nothing listens, instead of waiting for ray.init's retries
        try:
            socket.create_connection((m.group(1), int(m.group(2))), timeout=3).close()
        except OSError as e:
            return Result("ray", "ray.cluster", FAIL, f"{addr} (from {src}) does not answer: {e.strerror or e}",
                          "start the head (`ray start --head --port PORT`) or fix the address")
    try:
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            return Result("ray", "ray.cluster", FAIL, "ray is not installed in this Python; verl's trainer needs it",
                          "pip install 'ray[default]'")
    except (ImportError, ValueError):
        pass
    try:
        p = subprocess.run([sys.executable, "-c", _RAY_QUERY, addr], capture_output=True, text=True,
                           timeout=opt.ray_timeout, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    except subprocess.TimeoutExpired:
        return Result("ray", "ray.cluster", FAIL, f"{addr} (from {src}): no answer within {opt.ray_timeout:.0f}s",
                      "check the address and that this machine can reach the head's GCS port")
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ENVBUILD-RAY ")), None)
    if p.returncode != 0 or not line:
        err = [ln for ln in (p.stderr or "").splitlines() if ln.strip()]
        why = err[-1][:300] if err else f"exit {p.returncode}"
        return Result("ray", "ray.cluster", FAIL, f"{addr} (from {src}): ray.init failed: {why}",
                      "check the address, and that Ray and Python match the cluster's versions")
    info = json.loads(line.split(" ", 1)[1])
    fits = sum(1 for n in info["nodes"] if n["gpus"] >= per_node)
    total = info["gpus"]
    msg = (f"{addr} answers (Ray {info['version']}, {len(info['nodes'])} node(s), {total:g} GPUs); "
           f"needs {want}")
    if fits < nnodes:
        return Result("ray", "ray.cluster", FAIL,
                      msg + f": only {fits} node(s) have {per_node} GPUs (verl places n_gpus_per_node per node)",
                      "add nodes/GPUs or lower trainer.nnodes / trainer.n_gpus_per_node", info)
    return Result("ray", "ray.cluster", PASS, msg, details=info)


def rollout_ports(cfg: VerlConfig) -> tuple[str, list[int]]:
    """Fixed ports the rollout engine binds on each node (vocab.EngineSpec.ports_from: verl's SGLang
    rollout starts one engine per rank at port 30000 + rank); the others pick free ports at run time."""
    name = str(cfg.get("actor_rollout_ref.rollout.name") or "")
    spec = ENGINE.get(engine_of_rollout(name) or "")
    if spec is not None and spec.ports_from is not None:
        per_node = max(1, _num(cfg, "trainer.n_gpus_per_node", 1))
        return name, list(range(spec.ports_from, spec.ports_from + per_node))
    return name, []


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def check_rollout_ports(cfg: VerlConfig, ports: list[int] | None = None) -> Result:
    name, fixed = rollout_ports(cfg)
    ports = fixed if ports is None else ports
    if not ports:
        return Result("ray", "ray.rollout_ports", SKIP, f"rollout.name={name}: the engine picks free ports itself")
    busy = [p for p in ports if not port_free(p)]
    if busy:
        return Result("ray", "ray.rollout_ports", FAIL,
                      f"rollout.name={name} binds ports {ports[0]}-{ports[-1]} on each node; in use here: {busy}",
                      f"stop what listens there (`ss -ltnp 'sport = :{busy[0]}'`)", {"busy": busy})
    return Result("ray", "ray.rollout_ports", PASS, f"ports {ports[0]}-{ports[-1]} for {name} are free here")
