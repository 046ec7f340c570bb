"""Phalanx's own YAML file for one node's topology: readable, diffable, hand-writable.

Used by the simulator's cluster files, ``phalanx topology show``, and ``examples/topology/``.
A file looks like this (docs/topology.md has the full description)::

    apiVersion: phalanx.io/v1alpha1
    kind: NodeTopology
    node: dgx1v-01
    gpus:
      - {index: 0, model: Tesla V100-SXM2-16GB, memory_mib: 16384, numa: 0}
      - {index: 1, model: Tesla V100-SXM2-16GB, memory_mib: 16384, numa: 0}
    nics:
      - {name: mlx5_0, numa: 0}
    matrix:
      columns: GPU0 GPU1 mlx5_0
      GPU0:    X    NV1  NODE
      GPU1:    NV1  X    NODE
      mlx5_0:  NODE NODE X

Config-style strictness: an unknown key anywhere, a duplicate key, a missing row or cell, an
asymmetric pair, an unknown relation or a value beyond any node's (``model.device_problem``)
raises ``TopologyParseError`` naming the key or row. Text that is not YAML, or YAML Phalanx
refuses to build (an alias bomb, see ``phalanx_input``), raises ``phalanx_input.Unreadable``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import yaml

from phalanx_input import Unreadable, read_text, yaml_documents
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology.model import (
    TopologyParseError,
    asymmetry,
    cell_problem,
    device_problem,
    finish,
    is_indexed_nic,
    normalize_relation,
)

API_VERSION = "phalanx.io/v1alpha1"
KIND = "NodeTopology"


class _File(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    apiVersion: str  # noqa: N815 - the key as written in the file
    kind: str
    node: str
    generation: int = 0
    nvswitch: bool | None = None
    gpus: list[dict[str, Any]] = []
    nics: list[dict[str, Any]] = []
    matrix: dict[str, str | list[str]] = {}


def _where(source: str) -> str:
    return source.removeprefix("yaml:") or "<yaml>"


def _device(kind: type, entry: Any, path: str, defaults: dict[str, Any]) -> Any:
    """One ``gpus``/``nics`` entry as a model Struct, rejecting keys the model does not have."""
    if not isinstance(entry, dict):
        raise TopologyParseError(f"{path}: expected a mapping, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(kind.__struct_fields__))
    if unknown:
        raise TopologyParseError(f"{path}: unknown key {unknown[0]!r} "
                                 f"(allowed: {', '.join(kind.__struct_fields__)})")
    try:
        return msgspec.convert({**defaults, **entry}, kind)
    except msgspec.ValidationError as e:
        raise TopologyParseError(f"{path}: {e}") from None


def _gpu(entry: Any, i: int) -> Gpu:
    index = entry.get("index") if isinstance(entry, dict) else None
    defaults = {"name": f"GPU{index}"} if isinstance(index, int) else {}
    return _device(Gpu, entry, f"gpus[{i}]", defaults)


def _nic_device_default(name: Any) -> str:
    """As in the matrix: an RDMA-style name is its own device; ``NIC<n>`` says nothing."""
    return "" if not isinstance(name, str) or is_indexed_nic(name) else name


def _nic(entry: Any, i: int) -> Nic:
    name = entry.get("name") if isinstance(entry, dict) else None
    return _device(Nic, entry, f"nics[{i}]", {"device": _nic_device_default(name)})


def _cells(value: str | list[str]) -> list[str]:
    return value.split() if isinstance(value, str) else [str(c) for c in value]


def _relations(matrix: dict[str, str | list[str]], names: list[str]) -> dict[str, dict[str, str]]:
    rows = dict(matrix)
    columns = rows.pop("columns", None)
    if columns is not None and _cells(columns) != names:
        raise TopologyParseError(f"matrix.columns must list the gpus, then the nics, in file order: "
                                 f"{' '.join(names)} (got {' '.join(_cells(columns))})")
    for row in rows:
        if row not in names:
            raise TopologyParseError(f"matrix.{row}: not a device listed under gpus or nics")
    relations: dict[str, dict[str, str]] = {}
    for row in names:
        if row not in rows:
            raise TopologyParseError(f"matrix: no row for {row}")
        cells = _cells(rows[row])
        if len(cells) != len(names):
            raise TopologyParseError(f"matrix.{row}: {len(cells)} cells, expected {len(names)} "
                                     f"(one per column: {' '.join(names)})")
        for col, cell in zip(names, cells, strict=True):
            problem = cell_problem(row, col, cell)
            if problem:
                raise TopologyParseError(f"matrix.{row}: {problem}")
        relations[row] = {col: normalize_relation(c) for col, c in zip(names, cells, strict=True) if col != row}
    pair = asymmetry(relations, names)
    if pair:
        a, b = pair
        raise TopologyParseError(f"matrix: {a}–{b} is {relations[a][b]} but {b}–{a} is {relations[b][a]} "
                                 f"(the matrix must be symmetric)")
    return relations


def _check_names(gpus: list[Gpu], nics: list[Nic]) -> list[str]:
    names = [g.name for g in gpus] + [n.name for n in nics]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise TopologyParseError(f"device name {name!r} is used twice")
        seen.add(name)
    return names


def loads(text: str, *, source: str = "") -> NodeTopology:
    """Parse the YAML topology format; ``source`` (``yaml:<path>``) names the file in errors
    and in the model. Raises ``phalanx_input.Unreadable`` for text that is not (safe) YAML and
    ``TopologyParseError`` for YAML that is not a valid topology."""
    where = _where(source)
    try:
        docs = yaml_documents(text)
    except Unreadable as e:
        raise Unreadable(f"{where}: {e}") from None
    if len(docs) > 1:
        raise TopologyParseError(f"{where}: {len(docs)} YAML documents; a topology file holds one")
    data = docs[0] if docs else None
    try:
        doc = msgspec.convert(data, _File)
    except msgspec.ValidationError as e:
        raise TopologyParseError(f"{where}: {e}") from None
    try:
        return _model(doc, source)
    except TopologyParseError as e:
        raise TopologyParseError(f"{where}: {e}") from None


def _model(doc: _File, source: str) -> NodeTopology:
    if doc.apiVersion != API_VERSION or doc.kind != KIND:
        raise TopologyParseError(f"expected apiVersion: {API_VERSION} and kind: {KIND}, "
                                 f"got {doc.apiVersion} / {doc.kind}")
    gpus = [_gpu(e, i) for i, e in enumerate(doc.gpus)]
    nics = [_nic(e, i) for i, e in enumerate(doc.nics)]
    problem = device_problem(gpus, nics)
    if problem:
        raise TopologyParseError(problem)
    names = _check_names(gpus, nics)
    relations = _relations(doc.matrix, names)
    topo = finish(doc.node, gpus, nics, relations, source=source, nvswitch=doc.nvswitch)
    return msgspec.structs.replace(topo, generation=doc.generation)


def load(path: str | Path) -> NodeTopology:
    """Read a YAML topology file (``OSError``, ``Unreadable`` included, when it cannot be read)."""
    return loads(read_text(path), source=f"yaml:{path}")


# --- writing ------------------------------------------------------------------------------

def _flow(entry: dict[str, Any]) -> str:
    return yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=1 << 20).strip()


def _entries(key: str, entries: list[dict[str, Any]]) -> list[str]:
    if not entries:
        return [f"{key}: []"]
    return [f"{key}:"] + [f"  - {_flow(e)}" for e in entries]


def _matrix_lines(topo: NodeTopology) -> list[str]:
    names = [g.name for g in topo.gpus] + [n.name for n in topo.nics]
    if not names:
        return ["matrix: {}"]
    rows = {a: [topo.relation(a, b) for b in names] for a in names}
    widths = [max(len(b), *(len(rows[a][j]) for a in names)) for j, b in enumerate(names)]
    key_width = max(len("columns"), *map(len, names)) + 1

    def line(key: str, cells: list[str]) -> str:
        body = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return f"  {(key + ':').ljust(key_width)} {body}".rstrip()

    return ["matrix:", line("columns", names)] + [line(a, rows[a]) for a in names]


def dumps(topo: NodeTopology) -> str:
    """The model as a YAML topology file; ``loads(dumps(t), source=t.source) == t``."""
    head: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "node": topo.node}
    if topo.generation:
        head["generation"] = topo.generation
    head["nvswitch"] = topo.nvswitch
    gpus = []
    for g in topo.gpus:
        entry = msgspec.to_builtins(g)
        if entry["name"] == f"GPU{g.index}":
            del entry["name"]
        gpus.append(entry)
    nics = []
    for n in topo.nics:
        entry = msgspec.to_builtins(n)
        if entry.get("device", "") == _nic_device_default(n.name):
            entry.pop("device", None)
        elif "device" not in entry:
            entry["device"] = ""
        nics.append(entry)
    lines = ["# Phalanx node topology (format: docs/topology.md)",
             yaml.safe_dump(head, sort_keys=False, default_flow_style=False).rstrip(),
             *_entries("gpus", gpus), *_entries("nics", nics), *_matrix_lines(topo)]
    return "\n".join(lines) + "\n"


def dump(topo: NodeTopology, path: str | Path) -> None:
    """Write ``dumps(topo)`` to ``path``."""
    Path(path).write_text(dumps(topo), encoding="utf-8")


__all__ = ["API_VERSION", "KIND", "TopologyParseError", "dump", "dumps", "load", "loads"]
