"""What verl's trainer can load: every verl module a run from its entry (`python -m
verl.trainer.main_ppo`) could import, read from verl's code. probe.scope counts a module's importer
toward `core` only where that importer is in this set (an SFT trainer's dataset is not).

Over-approximated, since a module outside the set is ruled out for every run: the closure of every
import in a reached file (at module level, in functions and branches alike) and of every string
naming a verl module (the rollout registry and config `_target_`s load classes by name), from the
entry and from verl's own config files. Standard library only (runs inside images and in the census).
"""

from __future__ import annotations

import os
import re

from .features import TRAINER_ENTRY
from .staticimports import _sources

# Any import, at any indentation, and strings naming verl modules (in code and in config files).
_ANY_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+(?P<plain>[\w., \t]+)$|from[ \t]+(?P<dots>\.*)(?P<mod>[\w.]*)[ \t]+import[ \t]+"
                         r"(?P<names>\([^)]*\)|[^\n]*))", re.M)
_VERL_NAME = re.compile(r"""["'](verl(?:\.\w+)+)["':]""")
_VERL_NAME_YAML = re.compile(r"\b(verl(?:\.\w+)+)")
# A name computed from a verl package (f"verl.models.{name}.modeling", "verl.models." + name,
# "verl.models.%s" % name, "verl.models.{}".format(name)): any module under it may load.
_VERL_PREFIX = re.compile(r"""(?:\b[rR]?[fF][rR]?)?["'](verl(?:\.\w+)*)\.(?:\{|%|["'])""")


def trainer_reach(root: str, entry: str = TRAINER_ENTRY) -> set[str]:
    """The dotted names of the verl modules under `root` (a verl package folder) a run from
    `entry` could load; empty when `entry` is not there."""
    texts = dict(_sources(root))
    top = os.path.dirname(root)

    def path_of(mod: str) -> str | None:
        base = os.path.join(root, *mod.split(".")[1:])
        for p in (base + ".py", os.path.join(base, "__init__.py")):
            if p in texts:
                return p
        return None

    def prefixes(name: str) -> list[str]:  # the modules `import name` loads, each package above it too
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts) + 1)
                if parts[0] == "verl" and path_of(".".join(parts[:i]))]

    def under(package: str) -> list[str]:  # every module below a package (a computed name's candidates)
        mods = (".".join(os.path.relpath(p, top)[:-3].split(os.sep)) for p in texts)
        return [m.removesuffix(".__init__") for m in mods if m.startswith(package + ".")]

    seen: set[str] = set()
    if path_of(entry) is None:
        return seen
    todo = [entry] + sorted(_named_in_configs(root))
    while todo:
        name = todo.pop()
        if name.endswith(".*"):
            todo += under(name[:-2])
            continue
        for m in prefixes(name):
            if m not in seen:
                seen.add(m)
                p = path_of(m)
                if p:
                    todo += _imports(p, texts[p], top)
    return seen


def _imports(path: str, text: str, top: str) -> list[str]:
    """Every module a file names: its imports anywhere, relative ones resolved, and verl module
    names in its strings."""
    rel = os.path.relpath(path, top)[:-3].split(os.sep)
    return named_in_strings(text) + [name for name, _ in import_sites(text, rel[:-1])]


def named_in_strings(text: str) -> list[str]:
    """The verl modules a file names in its strings (importlib, a registry, a config's `_target_`);
    a name computed from a package (f"verl.models.{name}") as `package.*`."""
    return [m.group(1) for m in _VERL_NAME.finditer(text)] + [m.group(1) + ".*" for m in _VERL_PREFIX.finditer(text)]


def import_sites(text: str, package: list[str]) -> list[tuple[str, int]]:
    """(module, line) of every import statement in `text`, at any depth (functions, branches)."""
    return import_statements(text, package, _ANY_IMPORT)


def import_statements(text: str, package: list[str], pattern: re.Pattern) -> list[tuple[str, int]]:
    """(module, line) for each module the import statements `pattern` finds in `text` name (the
    module, and each name taken from it, which may be one), relative ones resolved from `package`
    (the parts of the package a relative import starts from). Read with a pattern, not a syntax
    tree: this runs over every file of verl. `pattern` has the groups plain, dots, mod and names."""
    out: list[tuple[str, int]] = []
    line, pos = 1, 0
    for m in pattern.finditer(text):
        line, pos = line + text.count("\n", pos, m.start()), m.start()
        if m.group("plain"):
            out += [(n.split(" as ")[0].strip(), line) for n in m.group("plain").split(",") if n.strip()]
            continue
        dots, base = len(m.group("dots")), m.group("mod") or ""
        if dots:
            parts = package[:len(package) - (dots - 1)] if dots > 1 else package
            base = ".".join(parts + ([base] if base else []))
        names = re.sub(r"#[^\n]*", "", m.group("names")).strip("()\n\\ ")
        out += [(base, line)] + [(f"{base}.{n.split(' as ')[0].strip()}", line) for n in names.split(",") if n.strip()]
    return out


def _named_in_configs(root: str) -> set[str]:
    out: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for fn in files:
            if fn.endswith((".yaml", ".yml")):
                try:
                    with open(os.path.join(dirpath, fn), encoding="utf-8", errors="replace") as fh:
                        out |= set(_VERL_NAME_YAML.findall(fh.read()))
                except OSError:
                    continue
    return out
