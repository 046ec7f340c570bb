"""``phalanx place``: ask the placement engine which GPUs (and NICs) of one node it would pick.

    phalanx place --topology FILE --count K [--free LIST] [--require LIST] [--rdma]
                  [--free-nics LIST] [--numa-sockets MAP] [--json]

FILE is an ``nvidia-smi topo -m`` capture or the project's topology YAML
(``phalanx_topology.load_file``). LIST is GPU indices like ``0,1,4-7`` (default: every GPU
of the node is free). Prints the chosen GPU indices (``0,1,2,3``); with ``--rdma`` a second
line names the NICs and the fallback level; ``--json`` prints ``{"gpus": [...], ...}`` with
the ring and the score. Exit 0 with an answer, 1 when nothing fits or the file is not a
valid topology (the reason on stderr), 2 when the file cannot be read or a flag is bad. GPU
indices are ASCII digits below 64 (no node has more GPUs); the range is checked before it is
expanded, so ``--free 0-99999999999`` is an error, not a memory bomb. ``--free-nics`` must name
NICs of the topology.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

import msgspec

from phalanx_engine.gpuset import NoChoice, choose_gpus
from phalanx_engine.rdma import choose_gpus_and_nics
from phalanx_kubeobjects.quantity import Bound, decimal
from phalanx_kubeobjects.violations import Violation
from phalanx_topology import TopologyParseError, load_file
from phalanx_topology.model import MAX_GPUS, MAX_NUMA, MAX_SOCKETS

_INDEX = Bound(MAX_GPUS - 1, f"a GPU index is below {MAX_GPUS} (no node has more GPUs)")
_COUNT = Bound(MAX_GPUS, f"no node has more than {MAX_GPUS} GPUs")


def _number(text: str, what: str, most: Bound, least: int = 0) -> int:
    """ASCII digits within ``least..most`` (``quantity.decimal``), else ArgumentTypeError."""
    n = decimal(text, what, most=most, least=least)
    if isinstance(n, Violation):
        raise argparse.ArgumentTypeError(f"{what} {n.value!r}: {n.rule}")
    return n


def gpu_count(text: str) -> int:
    """``--count``: 1 to 64 GPUs."""
    return _number(text.strip(), "GPU count", _COUNT, least=1)


def index_list(text: str) -> frozenset[int]:
    """``"0,1,4-7"`` -> {0, 1, 4, 5, 6, 7}; ``""`` -> empty. Each index is checked before a
    range is expanded. For argparse (ArgumentTypeError)."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        a = _number(lo, "GPU index", _INDEX)
        b = _number(hi, "GPU index", _INDEX) if sep else a
        if b < a:
            raise argparse.ArgumentTypeError(f"bad GPU index range {part!r}: it runs downwards")
        out.update(range(a, b + 1))
    return frozenset(out)


def name_list(text: str) -> frozenset[str]:
    return frozenset(x for x in text.replace(" ", "").split(",") if x)


def numa_socket_map(text: str) -> dict[int, int]:
    """``"0:0,1:0,2:1,3:1"`` -> NUMA node -> CPU socket."""
    out = {}
    for part in name_list(text):
        numa, sep, socket = part.partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"not a NUMA:socket map: {part!r} (expected e.g. 0:0,1:1)")
        out[_number(numa, "NUMA node", Bound(MAX_NUMA - 1, f"NUMA ids are below {MAX_NUMA}"))] = _number(
            socket, "socket", Bound(MAX_SOCKETS - 1, f"socket ids are below {MAX_SOCKETS}"))
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("place", help="choose GPUs (and RDMA NICs) on one node",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", required=True, metavar="FILE", help="nvidia-smi topo -m text or topology YAML")
    p.add_argument("--count", required=True, type=gpu_count, metavar="K", help="number of GPUs (1 to 64)")
    p.add_argument("--free", type=index_list, default=None, metavar="LIST", help="free GPU indices (default: all)")
    p.add_argument("--require", type=index_list, default=frozenset(), metavar="LIST",
                   help="GPU indices the set must contain")
    p.add_argument("--rdma", action="store_true", help="joint GPU + RDMA NIC placement (R7)")
    p.add_argument("--free-nics", type=name_list, default=None, metavar="LIST",
                   help="with --rdma: NIC names that may be used (default: all RDMA NICs)")
    p.add_argument("--numa-sockets", type=numa_socket_map, default=None, metavar="MAP",
                   help="with --rdma: NUMA node to CPU socket, e.g. 0:0,1:0,2:1,3:1 (enables the socket level)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        topology = load_file(args.topology)
    except OSError as e:
        print(f"phalanx place: cannot read {args.topology}: {e.strerror or e}", file=err)
        return 2
    except TopologyParseError as e:
        print(f"phalanx place: {args.topology}: {e}", file=err)
        return 1
    if args.free_nics is not None:
        unknown = sorted(args.free_nics - {n.name for n in topology.nics})
        if unknown:
            have = ", ".join(n.name for n in topology.nics) or "none"
            print(f"phalanx place: --free-nics: unknown NIC(s) {', '.join(unknown)} on {topology.node} "
                  f"(its NICs: {have})", file=err)
            return 2
    free = args.free if args.free is not None else frozenset(g.index for g in topology.gpus)
    try:
        if args.rdma:
            result = choose_gpus_and_nics(topology, free, args.count, args.require,
                                          free_nics=args.free_nics, numa_sockets=args.numa_sockets)
        else:
            result = choose_gpus(topology, free, args.count, args.require)
    except ValueError as e:
        print(f"phalanx place: {e}", file=err)
        return 2
    if isinstance(result, NoChoice):
        print(f"phalanx place: no fit on {topology.node} ({result.code}): {'; '.join(result.reasons)}", file=err)
        return 1
    choice = result.gpus if args.rdma else result
    doc = {"gpus": list(choice.gpus), "ring": list(choice.ring), "exact": choice.exact,
           "score": msgspec.to_builtins(choice.score)}
    if args.rdma:
        doc |= {"nics": list(result.nics), "level": str(result.level), "pairs": msgspec.to_builtins(result.pairs)}
    if args.json:
        print(json.dumps(doc, sort_keys=True), file=out)
        return 0
    print(",".join(str(i) for i in choice.gpus), file=out)
    if args.rdma:
        print(f"nics {','.join(result.nics)} level {result.level}", file=out)
    return 0
