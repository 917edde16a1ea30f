"""verl's trainer configuration as verl itself composes it, for `envbuild doctor`.

The base is verl's own `ppo_trainer` config, composed with Hydra: from the installed verl's
`verl/trainer/config` when verl is importable, else from the copy recorded per verl release in
`matrix/verl_config/<release>.json` (written by `ci/record_verl_config.py` from the released
wheels; never edited by hand). On top of it, as verl's `main_ppo` does: the user's YAML file
(loaded with OmegaConf's YAML 1.2 number rules, so `lr: 1e-6` is a float), then the overrides
(parsed with Hydra's own override grammar and applied the way Hydra applies them, in struct mode:
a key verl's config lacks is refused unless added with `+`). Interpolations (`${oc.select:...}`,
`${oc.env:VAR,default}`) are resolved by OmegaConf once, after every layer.

Hostile input ends in an InputError (exit 2, one line). envbuild.verl_input reads the file and the
overrides: the YAML file must be a regular UTF-8
file under a size cap (envbuild.yamlsafe's bounded read; its loader is not used because it reads
YAML 1.1 numbers and refuses anchors, which OmegaConf accepts), its nesting and alias expansion are bounded before anything is built, an
override's bracket nesting is bounded before Hydra's recursive parser sees it, and interpolation
chains are bounded in depth and expanded size before OmegaConf resolves them.
"""

from __future__ import annotations

import difflib
import json
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from .errors import InputError
from .paths import data_dir
from .verl_input import load_config_file, parse_override

CONFIG_NAME = "ppo_trainer"  # what verl's main_ppo composes (@hydra.main(config_name="ppo_trainer"))
# Hydra's own top-level entries in a config file, not trainer keys.
_META_KEYS = {"defaults", "hydra", "_self_"}

# Bounds on hostile input past the file and the overrides (envbuild.verl_input bounds those).
MAX_INTERP_DEPTH = 32
MAX_INTERP_CHARS = 1 << 20  # the longest string an interpolation may expand to
RESOLVE_SECONDS = 10.0


def recorded_dir() -> Path:
    return data_dir("matrix") / "verl_config"


def recorded_releases() -> list[str]:
    from packaging.version import Version

    d = recorded_dir()
    names = [p.stem for p in d.glob("*.json")] if d.is_dir() else []
    return sorted(names, key=Version)


def installed_config_dir() -> tuple[str, Path] | None:
    """(version, verl/trainer/config) of the verl this Python would import, without importing it
    (importing verl pulls in torch)."""
    try:
        spec = find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"
    if not (d / f"{CONFIG_NAME}.yaml").is_file():
        return None
    try:
        version = metadata.version("verl")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return version, d


def compose_trainer_config(config_dir: Path, name: str = CONFIG_NAME) -> dict:
    """verl's trainer config composed by Hydra (defaults lists, package overrides), unresolved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
            cfg = compose(config_name=name)
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=False)


def base_config(release: str | None = None, name: str = CONFIG_NAME) -> tuple[dict, str, dict]:
    """(verl's default trainer config `name` (ppo_trainer, or what `--config-name` picks), where it
    came from, what verl's code says about its values: {"choices": verl_choices, "refusals":
    verl_refusals}). `release`: judge against that verl release; default: the installed verl,
    else the newest recorded release."""
    from .verl_choices import choices_of_tree, recorded_choices
    from .verl_refusals import refusals_of_tree

    inst = installed_config_dir()
    note = ""
    if inst and release in (None, inst[0]):
        if not (inst[1] / f"{name}.yaml").is_file():
            raise InputError("command line", None, "--config-name", name,
                             f"verl {inst[0]} (installed) has no such trainer config in {inst[1]}")
        try:
            return (compose_trainer_config(inst[1], name), f"verl {inst[0]}, installed",
                    # facts read from the same install's code: the folder holding verl/
                    {"choices": choices_of_tree(inst[1].parents[2]), "refusals": refusals_of_tree(inst[1].parents[2]),
                     "installed": True})
        except Exception as e:  # a broken install: judge against a recorded copy, and say so
            note = f" (the installed verl's config did not compose: {type(e).__name__})"
            release = inst[0]
    known = recorded_releases()
    if known and (release is None or (note and release not in known)):
        release = known[-1]
    if release not in known:
        raise InputError("command line", None, "--verl", release,
                         f"no recorded trainer config for this release; recorded: {', '.join(known) or 'none'} "
                         "(ci/record_verl_config.py records them)")
    path = recorded_dir() / f"{release}.json"
    rec = json.loads(path.read_text())
    configs = rec.get("configs") or {}
    if name not in configs:
        raise InputError("command line", None, "--config-name", name,
                         f"not recorded for verl {release} (recorded: {', '.join(configs)}); install that verl "
                         "to judge it")
    return (configs[name], f"verl {release}, recorded from its wheel{note}",
            {"choices": recorded_choices(path), "refusals": rec.get("refusals") or []})


# --------------------------------------------------------------------------- the merged config


@dataclass
class Unknown:
    """A key verl's config does not have. From an override verl refuses it (struct mode); from a
    config file Hydra adds it and verl never reads it."""

    key: str
    source: str  # "override" or the config file
    suggestion: str | None


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaf keys; an empty dict is a leaf."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(_flatten(v, key))
            else:
                out[key] = v
    else:
        out[prefix] = tree
    return out


@dataclass
class VerlConfig:
    """verl's composed config, then the config file, then the overrides; resolved once."""

    base: dict
    origin: str
    explicit: dict[str, str] = field(default_factory=dict)  # key -> where the user set it
    unknown: list[Unknown] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # overrides verl would refuse, with Hydra's reason
    deleted: set[str] = field(default_factory=set)
    values: dict[str, Any] = field(default_factory=dict)  # dotted key -> raw (unresolved) value
    resolved: dict = field(default_factory=dict)
    choices: dict = field(default_factory=dict)  # key -> {"values", "where"}: what verl's code accepts
    refusals: list = field(default_factory=list)  # verl_refusals: what verl's rollout refuses at start-up
    installed: bool = False  # the base is the installed verl's (its own code can run here)
    config_name: str = CONFIG_NAME

    def __post_init__(self) -> None:
        self.defaults = _flatten(self.base)
        self.cfg = OmegaConf.create(self.base)
        OmegaConf.set_struct(self.cfg, True)

    # -- lookups (after finish())

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.resolved
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def is_explicit(self, key: str) -> bool:
        return key in self.explicit

    def default(self, key: str) -> Any:
        return self.defaults.get(key)

    def is_known(self, key: str) -> bool:
        """The key is in verl's config, also where its value is MISSING (`???`: present, unset;
        OmegaConf's select answers the default for those, which made them look unknown)."""
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(self.cfg, parent, default=_ABSENT, throw_on_resolution_failure=False) \
            if parent else self.cfg
        if isinstance(node, DictConfig):
            return leaf in node.keys()
        return OmegaConf.select(self.cfg, key, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT

    def unset(self) -> list[str]:
        """Keys still MISSING (`???`) after the file and the overrides, in sections that are not
        switched off (`enable: false` on the key's section or one above it): verl reads them."""
        out = []
        for key, v in _flatten(OmegaConf.to_container(self.cfg, resolve=False)).items():
            if v != "???":
                continue
            parts = key.split(".")
            if any(self.get(".".join(parts[:i] + ["enable"])) is False for i in range(1, len(parts))):
                continue
            out.append(key)
        return out

    def suggest(self, key: str) -> str | None:
        """The closest key of verl's config: same parent first (a typo in the last part), then anywhere."""
        known = self.defaults
        parent, _, leaf = key.rpartition(".")
        siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
        hit = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        if hit:
            return f"{parent}.{hit[0]}" if parent else hit[0]
        same_leaf = [k for k in known if k.rpartition(".")[2] == leaf]  # actor.use_kl_in_reward -> algorithm.
        if same_leaf:
            return difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0)[0]
        hit = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
        return hit[0] if hit else None

    # -- layers

    def merge_file(self, data: dict, source: str) -> None:
        data = {k: v for k, v in data.items() if k not in _META_KEYS}
        leaves = _flatten(data) if data else {}
        for key in leaves:
            if not self.is_known(key) and not any(u.key == key for u in self.unknown):
                self.unknown.append(Unknown(key, source, self.suggest(key)))
        try:
            # Hydra composes a config file without struct mode: its new keys are added
            OmegaConf.set_struct(self.cfg, False)
            self.cfg = OmegaConf.merge(self.cfg, OmegaConf.create(data))
        except OmegaConfBaseException as e:
            raise InputError(source, None, getattr(e, "full_key", None) or "yaml", "", _first_line(e)) from None
        except RecursionError:
            raise InputError(source, None, "yaml", "", "nested too deeply") from None
        finally:
            OmegaConf.set_struct(self.cfg, True)
        for key, v in leaves.items():
            self.explicit[key] = source
            self.values[key] = v

    def apply_override(self, line: str) -> None:
        """As Hydra 1.3's ConfigLoaderImpl._apply_overrides_to_config applies it, except that a key
        verl would refuse is collected (config.keys) instead of stopping at the first."""
        ov = parse_override(line)
        key, value = ov.key_or_group, ov.value()
        try:
            if ov.is_delete():
                cur = OmegaConf.select(self.cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)
                if cur is None:
                    self.refused.append(f"~{key}: Could not delete from config. '{key}' does not exist")
                    return
                parent, _, leaf = key.rpartition(".")
                with open_dict(self.cfg):
                    del (OmegaConf.select(self.cfg, parent) if parent else self.cfg)[leaf]
                self.deleted.add(key)
                self.explicit[key] = "override"
                return
            if ov.is_add():
                cur = OmegaConf.select(self.cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)
                if cur is not None and not isinstance(value, (dict, list)):
                    self.refused.append(f"+{key}: Could not append to config. An item is already at '{key}' "
                                        f"(drop the '+', or write ++{key}=...)")
                    return
                OmegaConf.update(self.cfg, key, value, merge=True, force_add=True)
            elif ov.is_force_add():
                OmegaConf.update(self.cfg, key, value, merge=True, force_add=True)
            else:
                try:
                    OmegaConf.update(self.cfg, key, value, merge=True)
                except (ConfigAttributeError, ConfigKeyError):
                    self.unknown.append(Unknown(key, "override", self.suggest(key)))
                    return
        except OmegaConfBaseException as e:
            self.refused.append(f"{line}: {_first_line(e)}")
            return
        self.deleted.discard(key)
        leaves = _flatten(value, key) if isinstance(value, dict) and value else {key: value}
        for k, v in leaves.items():
            self.explicit[k] = "override"
            self.values[k] = v

    def finish(self) -> None:
        """Resolve every interpolation once, as verl does (OmegaConf.resolve in its TaskRunner)."""
        raw = OmegaConf.to_container(self.cfg, resolve=False)
        _guard_interpolations(raw, self.explicit)
        try:
            with _deadline(RESOLVE_SECONDS):
                self.resolved = OmegaConf.to_container(self.cfg, resolve=True)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "interpolation"
            src = self.explicit.get(key, "command line")
            raw_v = OmegaConf.select(self.cfg, key, throw_on_resolution_failure=False) if key != "interpolation" else ""
            where = "command line" if src == "override" else src
            raise InputError(where, None, key, self.values.get(key, raw_v), _first_line(e)) from None
        except RecursionError:
            raise InputError("command line", None, "interpolation", "", "interpolations nested too deeply") from None


_ABSENT = object()


def _first_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return lines[0] if lines else type(e).__name__


_REF = re.compile(r"\$\{\s*(?:oc\.select\s*:\s*)?(\.*[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)")


def _guard_interpolations(raw: dict, explicit: dict[str, str]) -> None:
    """Depth and expanded length of every interpolation chain, before OmegaConf expands them: a
    chain of nine keys each naming the next ten times expands to 10^9 characters."""
    flat = _flatten(raw)
    memo: dict[str, int] = {}

    def size(key: str, depth: int, chain: tuple) -> int:
        if key in memo:
            return memo[key]
        if depth > MAX_INTERP_DEPTH:
            raise InputError(_where(chain[0], explicit), None, chain[0], flat.get(chain[0]),
                             f"interpolation chain deeper than {MAX_INTERP_DEPTH} ({' -> '.join(chain[:4])} ...)")
        if key in chain[:-1]:
            raise InputError(_where(chain[0], explicit), None, chain[0], flat.get(chain[0]),
                             f"interpolation cycle: {' -> '.join(chain)}")
        v = flat.get(key)
        if v is None:  # a subtree (or absent): its leaves
            under = [k for k in flat if k.startswith(key + ".")]
            total = sum(size(k, depth + 1, chain + (k,)) for k in under[:1000]) if under else 4
        elif not isinstance(v, str) or "${" not in v:
            total = len(str(v))
        else:
            total = len(v)
            parent = key.rpartition(".")[0]
            for ref in _REF.findall(v):
                if ref.startswith("."):  # relative: one dot = this key's parent, each further dot goes up
                    up = len(ref) - len(ref.lstrip("."))
                    base = parent.split(".") if parent else []
                    base = base[:len(base) - (up - 1)] if up > 1 else base
                    ref = ".".join(base + [ref.lstrip(".")])
                total += size(ref, depth + 1, chain + (ref,))
                if total > MAX_INTERP_CHARS:
                    break
        if total > MAX_INTERP_CHARS:
            raise InputError(_where(chain[0], explicit), None, chain[0], str(flat.get(chain[0]))[:80],
                             f"interpolations expand to more than {MAX_INTERP_CHARS} characters")
        memo[key] = total
        return total

    # the user's keys first, so that an error names the key the user wrote
    for k in sorted(flat, key=lambda k: k not in explicit):
        v = flat[k]
        if isinstance(v, str) and "${" in v:
            size(k, 0, (k,))


def _where(key: str, explicit: dict[str, str]) -> str:
    src = explicit.get(key, "verl's config")
    return "command line" if src == "override" else src


@contextmanager
def _deadline(seconds: float):
    """A wall-clock bound on pure-Python work (OmegaConf resolution), main thread only (SIGALRM)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum, frame):
        raise InputError("command line", None, "interpolation", "", f"resolving took more than {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def build_config(config_file: str | None, overrides: list[str], verl: str | None = None,
                 config_name: str = CONFIG_NAME) -> VerlConfig:
    base, origin, facts = base_config(verl, config_name)
    if config_name != CONFIG_NAME:
        origin = origin.replace(", ", f" ({config_name}), ", 1)
    cfg = VerlConfig(base, origin, choices=facts["choices"], refusals=facts["refusals"], config_name=config_name,
                     installed=facts.get("installed", False))
    if config_file:
        cfg.merge_file(load_config_file(config_file), str(config_file))
    for o in overrides:
        cfg.apply_override(o)
    cfg.finish()
    return cfg
