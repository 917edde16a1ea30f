"""The user's side of a verl configuration, for `envbuild doctor` (envbuild.verl_config merges it
onto verl's own): a YAML file read as OmegaConf reads it, and `main_ppo` overrides parsed with
Hydra's grammar, each bounded before a recursive parser sees it; hostile input ends in one
InputError line (exit 2).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf._utils import get_yaml_loader  # OmegaConf's loader: YAML 1.2 floats, no duplicate keys

from .errors import InputError
from .yamlsafe import decode, read_bounded

# Bounds on hostile input (a verl config is ~30 KB and ~1,500 nodes, nested < 10 deep).
MAX_FILE_BYTES = 4 << 20
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 200_000  # after alias expansion
MAX_OVERRIDE_CHARS = 65_536
MAX_OVERRIDE_NESTING = 64


# --------------------------------------------------------------------------- bounded YAML


def _guard_yaml(text: str, source: str) -> None:
    """Nesting depth and node count after alias expansion, from the event stream (PyYAML's parser
    is iterative; its composer and constructors recurse, and OmegaConf copies every alias)."""
    sizes: dict[str, int] = {}
    stack: list[list] = [[None, 0]]  # [anchor, nodes so far] per open collection
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                stack.append([ev.anchor, 1])
                if len(stack) > MAX_YAML_DEPTH + 1:
                    raise InputError(source, ev.start_mark.line + 1, "yaml", "",
                                     f"nested more than {MAX_YAML_DEPTH} levels deep")
                continue
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, n = stack.pop()
            elif isinstance(ev, yaml.ScalarEvent):
                anchor, n = ev.anchor, 1
            elif isinstance(ev, yaml.AliasEvent):
                anchor, n = None, sizes.get(ev.anchor, 1)
            else:
                continue
            if anchor:
                sizes[anchor] = n
            stack[-1][1] += n
            if stack[-1][1] > MAX_YAML_NODES:
                raise InputError(source, ev.start_mark.line + 1, "yaml", "",
                                 f"expands to more than {MAX_YAML_NODES} nodes (YAML aliases?)")
    except yaml.YAMLError as e:
        raise _yaml_error(source, e) from None


def _yaml_error(source: str, e: Exception) -> InputError:
    mark = getattr(e, "problem_mark", None)
    why = str(getattr(e, "problem", None) or e).splitlines()[0]
    return InputError(source, mark.line + 1 if mark else None, "yaml", "", why)


def load_config_file(path: str | Path) -> dict:
    """A user's verl YAML, as OmegaConf reads it (YAML 1.2 numbers), bounded."""
    source = str(path)
    text = decode(source, read_bounded(path, MAX_FILE_BYTES, "--config"))  # regular UTF-8 file, capped
    _guard_yaml(text, source)
    try:
        data = yaml.load(text, Loader=get_yaml_loader())  # noqa: S506 - OmegaConf's loader derives from SafeLoader
    except yaml.YAMLError as e:
        raise _yaml_error(source, e) from None
    except RecursionError:
        raise InputError(source, None, "yaml", "", "nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(source, None, "top level", type(data).__name__, "a verl config is a mapping")
    return data


# --------------------------------------------------------------------------- overrides


def _check_override_shape(line: str) -> None:
    if len(line) > MAX_OVERRIDE_CHARS:
        raise InputError("command line", None, "override", line[:60] + "...",
                         f"longer than {MAX_OVERRIDE_CHARS} characters")
    depth = deepest = 0
    for c in line:  # Hydra's ANTLR parser recurses per bracket: bound it before parsing
        if c in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]})":
            depth = max(0, depth - 1)
    if deepest > MAX_OVERRIDE_NESTING:
        raise InputError("command line", None, "override", line[:60] + ("..." if len(line) > 60 else ""),
                         f"brackets nested {deepest} deep (at most {MAX_OVERRIDE_NESTING})")


_PARSER = None


def parse_override(line: str):
    """One override through Hydra's own grammar (key=value, +key=value, ++key=value, ~key[=value])."""
    global _PARSER
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    _check_override_shape(line)
    if _PARSER is None:
        _PARSER = OverridesParser.create()
    try:
        [ov] = _PARSER.parse_overrides([line])
    except HydraException as e:
        raise InputError("command line", None, "override", line, _parse_problem(str(e), line)) from None
    except RecursionError:
        raise InputError("command line", None, "override", line[:60], "nested too deeply") from None
    except ValueError as e:  # Python's int() refuses numbers over 4300 digits
        raise InputError("command line", None, "override", line[:60] + ("…" if len(line) > 60 else ""),
                         f"not a value verl can take ({str(e).split(':')[0]})") from None
    if ov.is_sweep_override():
        raise InputError("command line", None, ov.key_or_group, line.partition("=")[2],
                         "comma-separated values are a Hydra sweep; write a list as [a,b] or quote the string")
    if ov.package is not None:
        raise InputError("command line", None, "override", line, "a @package override selects a config group; "
                         "doctor takes trainer keys")
    return ov


def _parse_problem(msg: str, line: str) -> str:
    """Hydra's parse error in one line: it spans lines ("Error parsing override", the problem, a
    caret under the input, a link to the grammar)."""
    lines = msg.splitlines()
    useful = [s.strip() for s in lines if s.strip() and s.strip() != "^"
              and not s.startswith(("See https://", "Error parsing override"))]
    text = useful[0] if useful else "not a Hydra override (key=value)"
    lexer = "LexerNoViableAltException: "
    if text.startswith(lexer):  # a character the grammar does not allow unquoted; the caret says which
        caret = next((s for s in lines if s.strip() == "^"), "")
        pos = len(caret) - 1 - len(lexer)
        ch = line[pos] if 0 <= pos < len(line) else "?"
        text = f"{ch!r} at position {pos + 1} is not allowed unquoted (quote the value: key='...')"
    return text
