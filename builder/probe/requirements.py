"""What `pip check` reports, for environments made without pip (uv makes them so): every installed
distribution's requirements present at a version they accept, metadata that parses, and wheels
tagged for this platform. Distributions are seen as pip sees them: the first of a name in sys.path
order (a copy shadowed by it is never imported), names canonical, markers evaluated with no extra.

env runs it as a child (`python -m ….requirements`), beside torch's import: one problem a line on
stdout; exit 0 when none, 1 when some, 3 when `packaging` is not installed.
"""

from __future__ import annotations

import importlib.metadata as md
import sys

from .vocab import EXIT_INFRA, EXIT_OK, EXIT_VERDICT

NO_PACKAGING = EXIT_INFRA  # no `packaging` here: nothing was judged


def problems() -> list[str] | None:
    """pip check's lines (its wording) for this environment; None without `packaging`."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.tags import parse_tag, sys_tags
        from packaging.utils import canonicalize_name
    except ImportError:
        return None
    first: dict[str, md.Distribution] = {}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            first.setdefault(canonicalize_name(name), d)
    out: list[str] = []
    supported = None
    for key, d in first.items():
        for req in d.requires or []:
            try:
                r = Requirement(req)
                if r.marker is not None and not r.marker.evaluate({"extra": ""}):
                    continue
            except (InvalidRequirement, ValueError, KeyError) as e:  # pip: "Error parsing dependencies"
                why = (str(e).splitlines() or [type(e).__name__])[0]
                out.append(f"{key} {d.version} has a requirement that does not parse: {req!r} ({why})")
                continue
            dep = canonicalize_name(r.name)
            have = first.get(dep)
            if have is None:
                out.append(f"{key} {d.version} requires {dep}, which is not installed.")
            elif not r.specifier.contains(have.version, prereleases=True):
                out.append(f"{key} {d.version} has requirement {r}, but you have {dep} {have.version}.")
        tags = _wheel_tags(d, parse_tag)
        if tags:
            supported = supported if supported is not None else set(sys_tags())
            if tags.isdisjoint(supported):
                out.append(f"{d.metadata['Name']} {d.version} is not supported on this platform")
    return sorted(set(out))


def _wheel_tags(d: md.Distribution, parse_tag) -> set:
    text = d.read_text("WHEEL")
    if not text:
        return set()  # not installed from a wheel: nothing to compare
    from email.parser import Parser
    tags = set()
    for value in Parser().parsestr(text).get_all("Tag", []):
        try:
            tags |= parse_tag(value.strip())
        except ValueError:
            continue
    return tags


def main() -> int:
    found = problems()
    if found is None:
        return NO_PACKAGING
    if found:
        print("\n".join(found))
    return EXIT_VERDICT if found else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
