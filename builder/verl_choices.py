"""The values verl accepts for its enum-valued keys, read from verl's own code (never a list of
ours): `algorithm.adv_estimator` (the AdvantageEstimator enum and every register_adv_est("name")
in trainer/ppo/core_algos.py), `actor_rollout_ref.actor.loss_agg_mode` (ActorConfig's list, or
core_algos.agg_loss's branches), `actor_rollout_ref.rollout.name` and, where the registry is keyed by
(name, mode) (0.6.1 on), `actor_rollout_ref.rollout.mode` (the rollout registry, read as the
verdict's registry check reads it: probe.registry.rollout_registry).

For an installed verl they are read from its files (verl_config.base_config); for a recorded release from
matrix/verl_config/<release>.json (ci/record_verl_config.py writes them beside the config).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from .probe.registry import rollout_registry
from .probe.staticcalls import Trees

ADV_KEY = "algorithm.adv_estimator"
ROLLOUT_KEY = "actor_rollout_ref.rollout.name"
MODE_KEY = "actor_rollout_ref.rollout.mode"
LOSS_AGG_KEY = "actor_rollout_ref.actor.loss_agg_mode"
CORE_ALGOS = "verl/trainer/ppo/core_algos.py"
ACTOR_CONFIG = "verl/workers/config/actor.py"
# The files choices_of_tree reads (the recorder extracts these from a wheel).
SOURCES = (CORE_ALGOS, ACTOR_CONFIG, "verl/workers/rollout/base.py", "verl/workers/fsdp_workers.py")


def choices_of_tree(root: str | Path) -> dict[str, dict]:
    """{key: {"values": [...], "where": "file:line"}} from the verl source tree under `root` (the
    folder holding verl/); a key whose source is not there is absent."""
    out: dict[str, dict] = {}
    trees = Trees()  # core_algos.py is read by two of them: parsed once
    adv = _advantage_estimators(trees.get(str(Path(root) / CORE_ALGOS)))
    if adv:
        out[ADV_KEY] = adv
    agg = _loss_agg_modes(Path(root), trees)
    if agg:
        out[LOSS_AGG_KEY] = agg
    reg = rollout_registry(str(Path(root) / "verl"))
    if reg:
        out[ROLLOUT_KEY] = {"values": list(reg["names"]), "where": reg["where"]}
        if reg.get("modes"):  # get_rollout_class(name, mode) finds nothing for another mode
            out[MODE_KEY] = {"values": list(reg["modes"]), "where": reg["where"]}
    return out


def _advantage_estimators(tree: ast.Module | None) -> dict | None:
    if tree is None:
        return None
    values, line = set(), None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "AdvantageEstimator":
            line = node.lineno
            for st in node.body:
                if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                    values.add(st.value.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "register_adv_est":
            for a in node.args[:1]:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    values.add(a.value)
    if not values:
        return None
    return {"values": sorted(values), "where": f"{CORE_ALGOS}:{line or 1}"}


def _loss_agg_modes(root: Path, trees: Trees) -> dict | None:
    """The loss aggregation modes verl accepts: ActorConfig's `valid_loss_agg_modes` (0.6 on, checked
    at start-up), else the if/elif of core_algos.agg_loss (0.4, 0.5: an unknown mode raises there,
    at the first update, after a whole rollout)."""
    for rel, fn in ((ACTOR_CONFIG, None), (CORE_ALGOS, "agg_loss")):
        tree = trees.get(str(root / rel))
        for node in ast.walk(tree) if tree else ():
            if fn is None and isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)) \
                    and any(isinstance(t, ast.Name) and "loss_agg_mode" in t.id for t in node.targets):
                values = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if values:
                    return {"values": sorted(values), "where": f"{rel}:{node.lineno}"}
            if fn and isinstance(node, ast.FunctionDef) and node.name == fn:
                values = sorted({c.value for n in ast.walk(node) if isinstance(n, ast.Compare)
                                 and isinstance(n.left, ast.Name) and n.left.id == "loss_agg_mode"
                                 for c in n.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)})
                if values:
                    return {"values": values, "where": f"{rel}:{node.lineno}"}
    return None


def recorded_choices(path: str | Path) -> dict[str, dict]:
    try:
        got = json.loads(Path(path).read_text()).get("choices")
    except (OSError, ValueError, AttributeError):
        return {}
    return got if isinstance(got, dict) else {}
