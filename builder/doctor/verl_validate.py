"""Run the installed verl's own start-up validation on a config; executed by doctor as a script in
a child process (importing verl pulls in torch and Ray; a crash or hang there is the child's).

argv[1]: a JSON file {"config": the merged, resolved trainer config}. stdout, last line: one JSON object
{"status": "pass" | "fail" | "skip", "function", "error", "where", "printed"}; verl's own prints
go to stderr meanwhile, and their text comes back in "printed".

What verl's main_ppo calls before any worker starts, with the same arguments it passes:
  - verl 0.6 on: verl.utils.config.validate_config(config, use_reference_policy, use_critic)
    (it also runs ActorConfig/CriticConfig.validate through the dataclasses);
  - verl 0.4, 0.5: RayPPOTrainer._validate_config, a method reading self.config,
    self.use_reference_policy and self.use_critic only.
use_reference_policy is main_ppo's rule (a reference worker is added when the KL is in the reward
or in the loss); use_critic is verl's need_critic where it has one, else the trainer's own rule
of those releases (GAE needs a critic). Standard library, OmegaConf and verl only.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import types


def _where(tb) -> str | None:
    """file:line of the innermost frame inside verl (what raised)."""
    hit = None
    for fr in traceback.extract_tb(tb):
        if f"{os.sep}verl{os.sep}" in fr.filename:
            hit = fr
    if hit is None:
        return None
    rel = hit.filename[hit.filename.rfind(f"{os.sep}verl{os.sep}") + 1:]
    return f"{rel}:{hit.lineno}"


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while e is not None and e not in out and len(out) < 32:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _run(data: dict, printed: io.StringIO) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(data["config"])
    actor = cfg.actor_rollout_ref.actor
    ref = bool(cfg.algorithm.get("use_kl_in_reward", False) or actor.get("use_kl_loss", False))
    try:
        from verl.utils.config import validate_config
    except ImportError as e:
        if getattr(e, "name", None) != "verl.utils.config":
            raise  # verl itself does not import here (a dependency missing): said, not judged
        validate_config = None  # 0.4, 0.5: the trainer's method below
    critic_enable = cfg.get("critic", {}).get("enable", None)
    if validate_config is not None:
        try:
            from verl.trainer.ppo.utils import need_critic
            critic = bool(need_critic(cfg))
        except ImportError:
            critic = bool(critic_enable) if critic_enable is not None else cfg.algorithm.adv_estimator == "gae"
        fn, call = "verl.utils.config.validate_config", lambda: validate_config(
            config=cfg, use_reference_policy=ref, use_critic=critic)
    else:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        if not hasattr(RayPPOTrainer, "_validate_config"):
            return {"status": "skip", "error": "this verl has no start-up validation doctor can call"}
        critic = cfg.algorithm.adv_estimator == "gae"
        me = types.SimpleNamespace(config=cfg, use_reference_policy=ref, use_critic=critic)
        fn, call = "verl.trainer.ppo.ray_trainer.RayPPOTrainer._validate_config", lambda: RayPPOTrainer._validate_config(me)
    try:
        with contextlib.redirect_stdout(printed):
            call()
    except Exception as e:
        # verl's own refusal: an AssertionError or ValueError (OmegaConf's ValidationError is one),
        # also where Hydra wraps it (a dataclass's __post_init__ runs inside instantiate). Anything
        # else (an import verl's dataclasses need) is this environment's: main() says it, no verdict.
        refusal = next((x for x in _chain(e) if isinstance(x, (AssertionError, ValueError))
                        and not isinstance(x, ImportError)), None)
        if refusal is None:
            raise
        return {"status": "fail", "function": fn, "error": f"{type(refusal).__name__}: {refusal}".strip(),
                "where": _where(refusal.__traceback__), "use_reference_policy": ref, "use_critic": critic}
    return {"status": "pass", "function": fn, "use_reference_policy": ref, "use_critic": critic}


def _missing(tree, prefix: str = "") -> list[str]:
    """The keys still `???` (OmegaConf's MISSING) in the config."""
    if isinstance(tree, dict):
        return [k for key, v in tree.items() for k in _missing(v, f"{prefix}{key}.")]
    return [prefix[:-1]] if tree == "???" else []


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        data = json.load(fh)
    printed = io.StringIO()
    real = sys.stdout
    sys.stdout = sys.stderr  # anything verl prints while importing stays off the result line
    try:
        out = _run(data, printed)
    except Exception as e:  # could not run verl's validation here: not a verdict on the config
        chain = _chain(e)  # Hydra wraps the import error that stopped it
        root = next((x for x in reversed(chain) if isinstance(x, ImportError)), chain[-1])
        text = f"{type(root).__name__}: {root}".splitlines()[0]
        if "$FULL_KEY" in text:  # OmegaConf's template, unfilled inside a dataclass conversion
            text = f"{type(root).__name__}: unset: {', '.join(_missing(data.get('config'))) or '?'}"
        out = {"status": "skip", "error": text[:300],
               "where": _where(root.__traceback__)}
    finally:
        sys.stdout = real
    out["printed"] = [ln for ln in printed.getvalue().splitlines() if ln.strip()][-20:]
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
