"""Parser for the text ``nvidia-smi topo -m`` prints, into a ``NodeTopology``.

Used by ``phalanx topology show``, the simulator and tests (the fixtures under
``tests/fixtures/topology/`` are real outputs). What it accepts:

* cells separated by spaces or tabs; ``#`` comment lines (a ``# SOURCE:`` line) anywhere;
* GPU rows (``GPU<n>``) and NIC rows (``mlx5_0`` style, or ``NIC<n>`` together with the
  ``NIC Legend:`` block that maps ``NIC0: mlx5_0``; the names in the matrix stay the keys);
* the trailing ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID`` columns, each optional;
* the table ends at the first blank line; the legend after it is ignored, except ``NIC Legend``.

Anything else (a missing cell, an asymmetric pair, fused column names such as ``GPU0GPU1``, a
row that is not a device, an unknown relation) raises one ``TopologyParseError`` naming the
line and the problem: a wrong model is never returned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology.model import (
    MAX_NUMA,
    TopologyParseError,
    asymmetry,
    canonical_cpulist,
    cell_problem,
    device_name_problem,
    finish,
    gpu_index,
    is_indexed_nic,
    normalize_relation,
)

__all__ = ["TopologyParseError", "parse_topo_matrix"]

EXTRA_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_EXTRA = re.compile(r"CPU\s+Affinity|NUMA\s+Affinity|GPU\s+NUMA\s+ID")
_LEGEND_ENTRY = re.compile(r"\s*(NIC\d+)\s*:\s*(\S+)\s*")


@dataclass(frozen=True, slots=True)
class _Header:
    line: int
    devices: tuple[str, ...]
    extras: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    name: str
    cells: tuple[str, ...]
    extras: dict[str, str]


def _fail(line: int, problem: str) -> TopologyParseError:
    return TopologyParseError(f"line {line}: {problem}")


def _lines(text: str) -> list[tuple[int, str]]:
    """Numbered lines (1-based), comment lines dropped, trailing whitespace stripped."""
    return [(i, raw.rstrip()) for i, raw in enumerate(text.splitlines(), start=1)
            if not raw.lstrip().startswith("#")]


def _parse_header(number: int, line: str) -> _Header:
    extras = tuple(" ".join(m.group(0).split()) for m in _EXTRA.finditer(line))
    first_extra = _EXTRA.search(line)
    device_part = line[:first_extra.start()] if first_extra else line
    if first_extra and _EXTRA.sub("", line[first_extra.start():]).strip():
        stray = _EXTRA.sub(" ", line[first_extra.start():]).split()[0]
        raise _fail(number, f"column {stray!r} comes after the affinity columns (devices come first)")
    devices = tuple(device_part.split())
    if not devices:
        raise _fail(number, "the header names no device columns")
    for name in devices:
        problem = device_name_problem(name)
        if problem:
            raise _fail(number, problem)
    seen: set[str] = set()
    for name in devices:
        if name in seen:
            raise _fail(number, f"column {name!r} appears twice")
        seen.add(name)
    if not any(gpu_index(d) is not None for d in devices):
        raise _fail(number, "the header has no GPU column (GPU0, GPU1, …)")
    if len(set(extras)) != len(extras):
        raise _fail(number, "an affinity column appears twice")
    return _Header(number, devices, extras)


def _parse_row(number: int, line: str, header: _Header) -> _Row:
    tokens = line.split()
    name, rest = tokens[0], tokens[1:]
    if name not in header.devices:
        raise _fail(number, f"row {name!r} is not a device of the header ({' '.join(header.devices)})")
    n = len(header.devices)
    allowed = (n + len(header.extras),) if gpu_index(name) is not None else (n, n + len(header.extras))
    if len(rest) not in allowed:
        want = f"{n} (one per device)"
        if header.extras:
            full = f"{n + len(header.extras)} ({n} devices + {', '.join(header.extras)})"
            want = full if len(allowed) == 1 else f"{want} or {full}"
        raise _fail(number, f"row {name!r} has {len(rest)} cells, expected {want}")
    cells = tuple(rest[:n])
    for col, cell in zip(header.devices, cells, strict=True):
        problem = cell_problem(name, col, cell)
        if problem:
            raise _fail(number, problem)
    extras = dict(zip(header.extras, rest[n:], strict=False))
    return _Row(number, name, cells, extras)


def _nic_legend(lines: list[tuple[int, str]], nic_columns: set[str]) -> dict[str, str]:
    """``NIC0 → mlx5_0`` from the ``NIC Legend:`` block, if the text has one."""
    legend: dict[str, str] = {}
    in_block = False
    for number, line in lines:
        if line.strip() == "NIC Legend:":
            in_block = True
            continue
        if not in_block or not line.strip():
            continue
        m = _LEGEND_ENTRY.fullmatch(line)
        if not m:
            break
        nic, device = m.groups()
        if nic not in nic_columns:
            raise _fail(number, f"NIC Legend names {nic!r}, which is not a column of the matrix")
        legend[nic] = device
    return legend


def _int_or_na(number: int, column: str, value: str) -> int:
    if value == "N/A":
        return -1
    if not (value.isascii() and value.isdigit()) or len(value) > 4 or int(value) >= MAX_NUMA:
        raise _fail(number, f"{column} is {value[:40]!r}, expected a NUMA node number below {MAX_NUMA} or N/A")
    return int(value)


def _cpus(number: int, value: str) -> str:
    try:
        return canonical_cpulist(value)
    except ValueError as e:
        raise _fail(number, f"CPU Affinity: {e}") from None


def _gpu(row: _Row) -> Gpu:
    if "GPU NUMA ID" in row.extras:
        _int_or_na(row.line, "GPU NUMA ID", row.extras["GPU NUMA ID"])  # validated, not modelled
    return Gpu(index=gpu_index(row.name), name=row.name,
               numa=_int_or_na(row.line, "NUMA Affinity", row.extras.get("NUMA Affinity", "N/A")),
               cpu_affinity=_cpus(row.line, row.extras.get("CPU Affinity", "")))


def _nic(row: _Row, legend: dict[str, str]) -> Nic:
    device = legend.get(row.name, "" if is_indexed_nic(row.name) else row.name)
    return Nic(name=row.name, device=device,
               numa=_int_or_na(row.line, "NUMA Affinity", row.extras.get("NUMA Affinity", "N/A")),
               cpu_affinity=_cpus(row.line, row.extras.get("CPU Affinity", "")))


def _table(lines: list[tuple[int, str]]) -> tuple[_Header, dict[str, _Row], int]:
    """The header and the rows up to the first blank line; also the index where the table ends."""
    start = next((i for i, (_, line) in enumerate(lines) if line.strip()), None)
    if start is None:
        raise TopologyParseError("line 1: no matrix found (the text is empty or only comments)")
    header = _parse_header(*lines[start])
    rows: dict[str, _Row] = {}
    end = start + 1
    while end < len(lines) and lines[end][1].strip() and lines[end][1].strip() != "Legend:":
        number, line = lines[end]
        row = _parse_row(number, line, header)
        if row.name in rows:
            raise _fail(number, f"row {row.name!r} appears twice (first on line {rows[row.name].line})")
        rows[row.name] = row
        end += 1
    last = lines[end - 1][0]
    missing = [d for d in header.devices if d not in rows]
    if missing:
        raise _fail(last, f"the matrix ends without a row for {', '.join(missing)}")
    return header, rows, end


def parse_topo_matrix(text: str, *, node: str, source: str = "") -> NodeTopology:
    """Parse ``nvidia-smi topo -m`` output into the node model.

    Relations keep nvidia-smi's strings, keyed by the names in the text (legacy ``SOC`` reads
    as ``SYS``). NUMA ids come from ``NUMA Affinity``; without it (or when every id is N/A),
    devices with the same CPU affinity share a domain numbered in order of first appearance.
    A NIC's NUMA id is that of the GPUs it reaches without crossing sockets. ``nvswitch`` is
    set when every GPU pair shows the same ``NV<k>`` and the bundle cannot be direct links.
    Raises ``TopologyParseError`` (a ``ValueError``) naming the line for a malformed matrix.
    """
    lines = _lines(text)
    header, rows, end = _table(lines)
    relations = {a: {b: normalize_relation(cell) for b, cell in zip(header.devices, rows[a].cells, strict=True)
                     if b != a} for a in header.devices}
    pair = asymmetry(relations, header.devices)
    if pair:
        a, b = pair
        raise _fail(rows[b].line, f"{a}–{b} is {relations[a][b]} on line {rows[a].line} "
                                  f"but {b}–{a} is {relations[b][a]} (the matrix must be symmetric)")
    nic_names = [d for d in header.devices if gpu_index(d) is None]
    legend = _nic_legend(lines[end:], set(nic_names))
    gpus = [_gpu(rows[d]) for d in header.devices if gpu_index(d) is not None]
    nics = [_nic(rows[d], legend) for d in nic_names]
    return finish(node, gpus, nics, relations, source=source)
