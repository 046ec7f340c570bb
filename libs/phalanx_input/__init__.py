"""Reading a user's files: the one path every command that takes a YAML or topology file uses
(``phalanx validate``, ``topology show``, ``place``, ``up``/``demo`` and the simulator's cluster
and workload files, topology-discovery's file mode).

Two kinds of failure, for two exit codes:

* ``Unreadable`` (exit 2, "cannot read"): the file is missing, a directory, larger than
  ``MAX_BYTES``, not UTF-8 text (binary, NUL bytes), or not YAML; or the YAML is one Phalanx
  refuses to build: an alias bomb (more than ``MAX_NODES`` nodes once aliases are expanded),
  nesting deeper than ``MAX_DEPTH``, a structure that contains itself, a number too long to
  convert. Checked while the YAML is composed, before any object is built, so a 2 KB bomb costs
  kilobytes.
* ``Invalid`` (exit 1, "read but invalid"): the documents were read, but their shape is not what
  the command needs; ``where`` names the field path (``nodes[1].gpuMemoryMiB``).

Nothing here raises anything else on any input: every other error of the YAML library is an
``Unreadable``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

import yaml
import yaml.constructor
import yaml.nodes

MAX_BYTES = 8 * 1024 * 1024
"""Largest file read (a Kubernetes object is at most 1.5 MiB; a file may hold several)."""
MAX_NODES = 1_000_000
"""Most YAML nodes in one document once every alias is expanded, or twice the text's length
when that is more (a node takes at least two characters, so a large file without aliases always
fits, and expanding aliases can cost at most a small multiple of reading the text)."""
MAX_DEPTH = 64
"""Deepest nesting of lists and maps (a pod template is about 12 levels deep)."""


def shown_key(key: Any) -> str:
    """A key for a message: its repr, cut to 60 characters."""
    text = repr(key) if isinstance(key, str | int | float | bool) or key is None else type(key).__name__
    return text if len(text) <= 60 else text[:50] + f"... ({len(text)} characters)"


class Unreadable(OSError):
    """The input cannot be read as text or YAML; ``str()`` is one line for the user. An
    ``OSError``, so callers that already handle "cannot open" handle it too."""


class Invalid(ValueError):
    """The input was read, but a field has the wrong shape: ``where`` is its path."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}" if where else problem)


def read_bytes(path: str | Path, *, stdin: IO[Any] | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of ``path`` (``-``: ``stdin``, default the process's), at most ``limit``;
    ``Unreadable`` otherwise. A text ``stdin`` (already decoded) is encoded back as UTF-8."""
    try:
        if str(path) == "-":
            stream = stdin if stdin is not None else sys.stdin
            data = getattr(stream, "buffer", stream).read(limit + 1)
            if isinstance(data, str):
                data = data.encode("utf-8", "surrogateescape")
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise Unreadable(e.strerror or str(e)) from None
    if len(data) > limit:
        raise Unreadable(f"larger than {limit} bytes")
    return data


def decode(data: bytes) -> str:
    """``data`` as UTF-8 text (a leading BOM dropped); ``Unreadable`` for binary data."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise Unreadable(f"not a text file (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise Unreadable(f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_text(path: str | Path, *, stdin: IO[Any] | None = None, limit: int = MAX_BYTES) -> str:
    """``read_bytes`` then ``decode``."""
    return decode(read_bytes(path, stdin=stdin, limit=limit))


def yaml_documents(text: str, *, loader: type[yaml.SafeLoader] | None = None) -> list[Any]:
    """Every document of a (multi-document) YAML text, built by ``loader`` (default
    ``BoundedLoader``; a subclass of it keeps the bounds); empty documents are kept as None.
    ``Unreadable`` for text that is not YAML or breaks a bound."""
    loader_cls = loader or BoundedLoader
    try:
        instance = loader_cls(text)
        try:
            docs = []
            while instance.check_data():
                docs.append(instance.get_data())
            return docs
        finally:
            instance.dispose()
    except Unreadable:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}: " if mark else ""
        raise Unreadable(f"{where}not valid YAML ({' '.join(str(e.problem or e.context).split())})") from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:
        raise Unreadable(f"not valid YAML ({' '.join(str(e).split()) or type(e).__name__})") from None


def yaml_file(path: str | Path, *, stdin: IO[Any] | None = None, loader: type[yaml.SafeLoader] | None = None,
              limit: int = MAX_BYTES) -> list[Any]:
    """The YAML documents of a file (``-``: stdin): ``read_text`` then ``yaml_documents``."""
    return yaml_documents(read_text(path, stdin=stdin, limit=limit), loader=loader)


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the bounds above, enforced while composing: each node's size
    counts every node under it, aliases included, so a billion-laughs document is refused at
    its first level past ``MAX_NODES``; an alias to a node still being composed (a structure
    that contains itself) and nesting past ``MAX_DEPTH`` are refused too. A mapping with a
    duplicate key is refused (YAML forbids it; kubectl refuses it) rather than keeping the last."""

    def construct_mapping(self, node: yaml.nodes.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {shown_key(key)}",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}
        self._depth = 0
        self._most = max(MAX_NODES, 2 * len(stream))

    def compose_document(self) -> yaml.nodes.Node:
        self._sizes = {}
        return super().compose_document()

    def compose_node(self, parent: yaml.nodes.Node | None, index: Any) -> yaml.nodes.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise Unreadable(f"line {event.start_mark.line + 1}: the alias *{event.anchor} refers to a "
                                 "structure that contains it (a self-referencing structure)")
            self._count(size, event)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise Unreadable(f"line {self.peek_event().start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.nodes.ScalarNode):
            size = 1
        elif isinstance(node, yaml.nodes.SequenceNode):
            size = 1 + sum(self._sizes[id(n)] for n in node.value)
        else:
            size = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        self._sizes[id(node)] = size
        self._count(size, node)
        return node

    def _count(self, size: int, at: Any) -> None:
        if size > self._most:
            raise Unreadable(f"line {at.start_mark.line + 1}: more than {self._most} YAML nodes once aliases are "
                             "expanded (an alias bomb?)")
