"""What a user's verl run enters beyond verl's core path: the scopes (features.FEATURE_SPECS, `model:T`)
of a verl YAML config, a launch script with `main_ppo` overrides, or `--feature`/`--model-type` flags.

pick and doctor ask through it, so a run is read one way: a feature is entered when one of its
descriptor's config keys has the value that switches it on; the model type is read from the
model folder's config.json when `actor_rollout_ref.model.path` is a local folder.
"""

from __future__ import annotations

import json
import os
import re
import shlex

from .errors import InputError
from .probe.features import FEATURE, FEATURES, FEATURE_SPECS, MODEL_SCOPE, parse_scope

MODEL_PATH = "actor_rollout_ref.model.path"
MAX_SCRIPT_BYTES = 1 << 20


def flatten(d: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def _on(value: object, want: object) -> bool:
    s = str(value).strip().strip("'\"").lower()
    if want is True:
        return s in ("true", "1", "yes", "on")
    if isinstance(want, str) and want.startswith(">"):
        try:
            return float(s) > float(want[1:])
        except ValueError:
            return False
    return s == str(want).lower()


def scopes_of(flat) -> set[str]:
    """The features a config switches on, and its model type if readable. `flat`: `a.b.c` -> value
    (a dict, or anything with .get, such as doctor's composed VerlConfig)."""
    out = set()
    for f in FEATURE_SPECS:
        for key, want in f.config:
            got = flat.get(key)
            if got is not None and _on(got, want):
                out.add(f.name)
    path = flat.get(MODEL_PATH)
    if isinstance(path, str) and os.path.isfile(os.path.join(path, "config.json")):
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
                mt = json.load(fh).get("model_type")
        except (OSError, ValueError, AttributeError):
            mt = None
        if isinstance(mt, str) and re.fullmatch(r"[A-Za-z0-9_.\-]+", mt):
            out.add(MODEL_SCOPE + mt.lower())
    return out


def overrides_of_script(path: str) -> list[str]:
    """The `key=value` overrides a launch script passes to verl's main_ppo, `+`/`~` stripped (what
    a run enters is the same whether a key is added or set)."""
    return [o.lstrip("+~") for o in script_overrides(path)[0] if not o.startswith("-")]


HYDRA_CONFIG_FLAGS = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")


def hydra_flags(items: list[str]) -> tuple[dict[str, str], list[str]]:
    """({"config-name": X, ...}, the rest) of main_ppo's arguments: Hydra's config flags
    (`--config-name=X`, `--config-name X`, `-cn X`) and the overrides; `.yaml` dropped from the
    name as Hydra drops it. Any other option is refused in one line (doctor's own options given
    after `--`, where main_ppo's arguments go)."""
    long = {"-cn": "config-name", "-cp": "config-path", "-cd": "config-dir"}
    flags: dict[str, str] = {}
    rest: list[str] = []
    it = iter(items)
    for w in it:
        if not w.startswith("-"):
            rest.append(w)
            continue
        name, eq, value = w.partition("=")
        if name not in HYDRA_CONFIG_FLAGS:
            raise InputError("command line", None, "override", w,
                             "not an override of verl's main_ppo: envbuild doctor's own options go before `--`; "
                             "after it only key=value overrides and Hydra's --config-name")
        if not eq:
            value = next(it, "")
        key = long.get(name, name.lstrip("-"))
        flags[key] = value[:-5] if key == "config-name" and value.endswith(".yaml") else value
    return flags, rest


_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")
_ARRAY = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+-a\s+)?([A-Za-z_][A-Za-z0-9_]*)=\((.*)$")
_ARRAY_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}")


def _words(line: str) -> list[str]:
    """A shell line's words, quotes removed, `#` comments dropped."""
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def script_overrides(path: str) -> tuple[list[str], list[str]]:
    """(overrides, keys left out) of the command that runs verl's main_ppo in a launch script, as
    verl receives them (`+key=v`, `~key` kept; Hydra's `--config-name=X` kept as one item, for
    hydra_flags). Line continuations are joined; the script's own
    plain assignments (`bsz=8`, `export X=...`, `${X:-default}`, integer `$((a / 2))`) are expanded;
    an override that still names the environment (`$HOME`, a command's output) is left out and
    named, never guessed."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SCRIPT_BYTES + 1)
    except OSError as e:
        raise InputError(path, None, "--config", path, f"cannot read: {e.strerror}") from None
    text = raw.decode("utf-8", errors="replace").replace("\\\n", " ")
    env: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}  # NAME=( words ... ): what "${NAME[@]}" hands main_ppo
    collecting: list[str] | None = None
    out: list[str] = []
    left: list[str] = []
    for line in text.splitlines():
        if collecting is not None:  # inside NAME=( ... ), one word list per line, `)` alone ends it
            if line.strip().startswith(")"):
                collecting = None
            else:
                collecting += _words(line)
            continue
        a = _ARRAY.match(line)
        if a and "main_ppo" not in line:
            body = a.group(2)
            if body.rstrip().endswith(")"):  # NAME=(a b c) on one line
                arrays[a.group(1)] = _words(body.rstrip()[:-1])
            else:
                collecting = arrays[a.group(1)] = _words(body)
            continue
        m = _ASSIGN.match(line)
        if m and "main_ppo" not in line:
            raw_value = re.sub(r"\s+#.*$", "", m.group(2)).strip()
            if _ARITH.fullmatch(raw_value):  # $((a / 2)): one word to bash, several to shlex
                words = [raw_value]
            else:
                try:
                    words = shlex.split(raw_value)
                except ValueError:
                    words = []
            value = _expand(words[0], env) if len(words) == 1 else ("" if not words else None)
            if value is not None:
                env[m.group(1)] = value
            else:
                env.pop(m.group(1), None)
            continue
        if "main_ppo" not in line:
            continue
        words = []
        for w in _words(line):
            ref = _ARRAY_REF.fullmatch(w)
            words += arrays.get(ref.group(1), []) if ref else [w]
        after, flag = False, None
        for w in words:
            if flag:  # the value of `--config-name X`
                out.append(f"{flag}={_expand(w, env) or w}")
                flag = None
            elif after and w.partition("=")[0] in HYDRA_CONFIG_FLAGS:
                if "=" in w:
                    out.append(_expand(w, env) or w)
                else:
                    flag = w
            elif after and "=" in w and not w.startswith("-"):
                got = _expand(w, env)
                if got is None:
                    left.append(w.split("=", 1)[0])
                else:
                    out.append(got)
            elif after and w.startswith("~") and "=" not in w:
                out.append(w)
            elif w.endswith("main_ppo") or w.endswith("main_ppo.py"):
                after = True
    return out, left


def _expand(word: str, env: dict[str, str]) -> str | None:
    """`word` with the script's own variables and integer arithmetic filled in; None when it still
    needs the environment."""
    def var(m):
        name, default = m.group(1) or m.group(3), m.group(2)
        if name in env:
            return env[name]
        if default is not None and "$" not in default:
            return default
        raise KeyError(name)

    try:
        word = _ARITH.sub(lambda m: str(_arith(_VAR.sub(var, m.group(1)), env)), word)
        word = _VAR.sub(var, word)
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return None if ("$" in word or "`" in word) else word


def _arith(expr: str, env: dict[str, str]) -> int:
    """Integer + - * / % of literals and names (bash's $((...)) for what launch scripts compute)."""
    tokens = re.findall(r"\d+|[A-Za-z_][A-Za-z0-9_]*|[-+*/%()]", expr)
    if "".join(tokens) != re.sub(r"\s+", "", expr):
        raise ValueError(expr)
    py = " ".join(env[t] if t in env else ("//" if t == "/" else t) for t in tokens)
    if not re.fullmatch(r"[\d\s+*/%()-]+", py):
        raise ValueError(expr)
    return int(eval(py, {"__builtins__": {}}, {}))  # noqa: S307 - digits and operators only (checked above)


def scopes_of_config(path: str) -> set[str]:
    """A verl YAML file or a launch script (anything that is not YAML) -> its scopes."""
    if path.endswith((".yaml", ".yml")):
        from .verl_input import load_config_file  # needs PyYAML: only when a YAML file is given

        return scopes_of(flatten(load_config_file(path)))
    flat = {}
    for ov in overrides_of_script(path):
        k, _, v = ov.partition("=")
        flat[k.strip()] = v.strip()
    return scopes_of(flat)


def scopes_from_flags(features: list[str] | None, model_types: list[str] | None) -> set[str]:
    out = set()
    for f in features or []:
        s = parse_scope(f)
        if s is None or s not in FEATURE:
            raise InputError("command line", None, "--feature", f, f"not a feature ({', '.join(FEATURES)})")
        out.add(s)
    for t in model_types or []:
        s = parse_scope(f"model:{t}")
        if s is None:
            raise InputError("command line", None, "--model-type", t, "not a model_type (qwen2, qwen3_5, glm4v, ...)")
        out.add(s)
    return out


def add_run_arguments(p) -> None:
    p.add_argument("--feature", action="append", metavar="F",
                   help=f"your run uses this opt-in path of verl (repeatable): {', '.join(FEATURES)}")
    p.add_argument("--model-type", action="append", metavar="T",
                   help="your model's model_type (config.json), e.g. qwen2, qwen3_5, glm4v (repeatable)")
    p.add_argument("--config", metavar="FILE", dest="run_config",
                   help="your run: a verl YAML config or a launch script with main_ppo overrides")


def scopes_from_args(args) -> frozenset:
    out = scopes_from_flags(getattr(args, "feature", None), getattr(args, "model_type", None))
    if getattr(args, "run_config", None):
        out |= scopes_of_config(args.run_config)
    return frozenset(out)
