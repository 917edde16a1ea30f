"""One bounded, safe YAML loader for every YAML file envbuild reads (the matrix, doctor's config).

A YAML file is user input: it may be huge, deeply nested, an alias bomb, or not text at all.
This loader refuses before any expansion, so every bad file becomes one InputError
(file:line field=value why) and never a traceback, a hang or gigabytes of memory:

- size: only regular files (a FIFO or a device would block or never end), at most `max_bytes`,
  checked before parsing;
- encoding: UTF-8 only (a BOM is allowed), the offending line named;
- aliases and anchors are refused (they are how an alias bomb expands), and so is any explicit
  tag (`!!python/object`, `!custom`, even `!!str`) and the merge key `<<`;
- depth and node count are bounded while the document is composed, so a 1,000-deep list stops
  at `max_depth` instead of reaching Python's recursion limit;
- numbers: an integer or float written with more than MAX_NUMBER_CHARS characters is refused
  (Python refuses to convert 4,300+ digits; hex and sexagesimal have no such guard).

`load(path)` returns the plain data and a map from key path (a tuple of keys and list indexes)
to its 1-based line, which validators use to name the line of a bad value.
"""

from __future__ import annotations

import codecs
import os
import stat
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from .errors import InputError

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000
DEPTH_CEILING = 100  # the composer recurses (~3 frames a level): stay far below Python's limit
MAX_NUMBER_CHARS = 64

_MERGE = "tag:yaml.org,2002:merge"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def read_bounded(path: str | os.PathLike, max_bytes: int = MAX_BYTES, field: str = "file") -> bytes:
    """The bytes of a regular file of at most `max_bytes`; anything else is an InputError.

    Opened non-blocking so a FIFO is refused instead of waiting for a writer."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(name, None, field, name, f"cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(name, None, field, name, "not a regular file")
        if st.st_size > max_bytes:
            raise InputError(name, None, field, name, f"{st.st_size} bytes: larger than the limit of {max_bytes}")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(max_bytes + 1)  # the file may have grown since fstat
    except OSError as e:
        raise InputError(name, None, field, name, f"cannot read: {e.strerror or e}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        raise InputError(name, None, field, name, f"larger than the limit of {max_bytes} bytes")
    return data


def decode(name: str, data: bytes) -> str:
    """UTF-8 text (a leading BOM dropped), or an InputError naming the line of the first bad byte."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(name, line, "encoding", data[e.start:e.start + 4], "not UTF-8 text (save the file as UTF-8)") \
            from None


def read_text(path: str | os.PathLike, max_bytes: int = MAX_BYTES, field: str = "file") -> str:
    """A bounded read of a regular UTF-8 text file (for any data file given by a user)."""
    return decode(os.fspath(path), read_bounded(path, max_bytes, field))


class _Refused(Exception):
    """Raised inside the composer; carries what the InputError needs."""

    def __init__(self, line: int, path: tuple, value: object, why: str):
        self.line, self.path, self.value, self.why = line, path, value, why


class _Resolver(yaml.resolver.Resolver):
    """YAML 1.1 implicit types, without the `=` value tag (no constructor: a bare `=` is text)."""


_Resolver.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:value"]
    for ch, rules in yaml.resolver.Resolver.yaml_implicit_resolvers.items()}


class _BoundedLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                     yaml.constructor.SafeConstructor, _Resolver):
    """A SafeLoader whose composer refuses aliases, anchors, tags and merge keys and counts."""

    def __init__(self, text: str, max_depth: int, max_nodes: int):
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _Resolver.__init__(self)
        self.max_depth, self.max_nodes = max_depth, max_nodes
        self.nodes = self.depth = 0
        self.path: list = []

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        is_key = index is None and isinstance(parent, MappingNode)
        key = "?" if is_key else index.value if isinstance(index, ScalarNode) else index
        where = tuple(self.path) + (() if parent is None or is_key else (key,))
        if isinstance(event, AliasEvent):
            raise _Refused(line, where, "*" + event.anchor, "YAML aliases are not allowed (write the value out)")
        if event.anchor is not None:
            raise _Refused(line, where, "&" + event.anchor, "YAML anchors are not allowed (write the value out)")
        if getattr(event, "tag", None) is not None:
            raise _Refused(line, where, event.tag, "explicit YAML tags are not allowed")
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise _Refused(line, where, self.nodes, f"more than {self.max_nodes} YAML nodes")
        if self.depth >= self.max_depth:
            raise _Refused(line, where, self.depth + 1, f"nested deeper than {self.max_depth} levels")
        if parent is not None:
            self.path.append(key)
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
            if parent is not None:
                self.path.pop()
        if isinstance(node, ScalarNode):
            if node.tag == _MERGE:
                raise _Refused(line, where, node.value,
                               "YAML merge keys (<<) are not allowed (write the keys out, or quote the text)")
            if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
                raise _Refused(line, where, node.value, f"a number longer than {MAX_NUMBER_CHARS} characters")
        return node


def load(path: str | os.PathLike, *, text: str | bytes | None = None, max_bytes: int = MAX_BYTES,
         max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES, str_keys: bool = True
         ) -> tuple[Any, dict[tuple, int]]:
    """Load one YAML document -> (data, {key path: line}).

    `path` names the file in errors and is read (regular file, bounded) unless `text` is given.
    Raises InputError for every malformed, oversized or hostile input."""
    name = os.fspath(path)
    if text is None:
        text = read_bounded(name, max_bytes)
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise InputError(name, None, "file", name, f"larger than the limit of {max_bytes} bytes")
        text = decode(name, text)
    elif len(text) > max_bytes:
        raise InputError(name, None, "file", name, f"larger than the limit of {max_bytes} characters")
    max_depth = min(max_depth, DEPTH_CEILING)
    loader = None
    try:
        loader = _BoundedLoader(text, max_depth, max_nodes)  # the reader checks characters here
        node = loader.get_single_node()
    except _Refused as r:
        raise InputError(name, r.line, _dotted(r.path), r.value, r.why) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1 if isinstance(e.position, int) else None
        raise InputError(name, line, "yaml", chr(e.character) if isinstance(e.character, int) else e.character,
                         f"not allowed in YAML: {e.reason}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = " ".join(filter(None, (getattr(e, "context", None), getattr(e, "problem", None)))) or str(e)
        raise InputError(name, mark.line + 1 if mark else None, "yaml", "",
                         "malformed YAML: " + " ".join(problem.split())) from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[tuple, int] = {}
    data = None if node is None else _convert(name, loader, node, (), lines, str_keys)
    return data, lines


def _convert(name: str, ctor: _BoundedLoader, n, p: tuple, lines: dict, str_keys: bool):
    """Nodes -> plain data; depth is bounded by the composer, so plain recursion is safe."""
    lines[p] = n.start_mark.line + 1
    if isinstance(n, MappingNode):
        out: dict = {}
        for k, v in n.value:
            kline = k.start_mark.line + 1
            if not isinstance(k, ScalarNode):
                raise InputError(name, kline, _dotted(p), "", "a key must be a plain value, not a list or mapping")
            key = _scalar(name, ctor, k, p)
            if str_keys and not isinstance(key, str):
                raise InputError(name, kline, _dotted(p), key, "keys must be strings")
            if key in out:
                raise InputError(name, kline, _dotted(p + (key,)), key, "duplicate key")
            lines[p + (key,)] = kline
            out[key] = _convert(name, ctor, v, p + (key,), lines, str_keys)
        return out
    if isinstance(n, SequenceNode):
        return [_convert(name, ctor, v, p + (i,), lines, str_keys) for i, v in enumerate(n.value)]
    return _scalar(name, ctor, n, p)


def _scalar(name: str, ctor: _BoundedLoader, n: ScalarNode, p: tuple):
    try:
        return ctor.construct_object(n)
    except (yaml.YAMLError, ValueError, OverflowError) as e:  # e.g. a timestamp 2024-13-45
        why = getattr(e, "problem", None) or str(e)
        raise InputError(name, n.start_mark.line + 1, _dotted(p), n.value,
                         "cannot read this value (quote it if it is text): " + " ".join(why.split())) from None


def _dotted(p: tuple) -> str:
    return ".".join(map(str, p)) or "top"
