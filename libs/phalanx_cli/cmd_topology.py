"""``phalanx topology show FILE`` and ``phalanx topology discover``: a node's GPUs, NVLink
groups, NICs and NUMA layout, read from a file (``nvidia-smi topo -m`` text or the YAML
format) or from this machine's NVML. ``--json`` prints one document (``report.document``).

Exit codes: 0 shown; 1 the file was read but is not a valid topology; 2 the file cannot be
read (missing, too large, binary, not YAML), or NVML is not available here.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from phalanx_nvml import DiscoveryError, NvmlDiscovery, NvmlUnavailable
from phalanx_proto.topology import NodeTopology
from phalanx_topology import TopologyParseError, load_file
from phalanx_topology.report import document, render_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("topology", help="show a node's GPU/NIC topology (from a file or NVML)")
    actions = parser.add_subparsers(dest="topology_action", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))

    show = actions.add_parser("show", help="read a topology file: nvidia-smi topo -m text or Phalanx YAML")
    show.add_argument("file", help="path to the file")
    show.add_argument("--node", help="node name (default: the file's, or the file name for a matrix)")
    show.add_argument("--json", action="store_true", help="print one JSON document")
    show.set_defaults(func=_show)

    discover = actions.add_parser("discover", help="read this machine's topology through NVML and sysfs")
    discover.add_argument("--node", default=socket.gethostname(), help="node name (default: host name)")
    discover.add_argument("--sysfs-root", default="/", help="where sys/ is mounted (default: /)")
    discover.add_argument("--json", action="store_true", help="print one JSON document")
    discover.set_defaults(func=_discover)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _print(topo: NodeTopology, as_json: bool) -> int:
    if as_json:
        print(json.dumps(document(topo), indent=2))
    else:
        print(render_text(topo), end="")
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        topo = load_file(args.file, node=args.node)
    except OSError as e:
        print(f"phalanx topology show: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    except TopologyParseError as e:
        print(f"phalanx topology show: {args.file}: {e}", file=sys.stderr)
        return 1
    return _print(topo, args.json)


def _discover(args: argparse.Namespace) -> int:
    try:
        topo = NvmlDiscovery(sysfs_root=args.sysfs_root).discover(args.node)
    except NvmlUnavailable as e:
        print(f"phalanx topology discover: NVML not available: {e}", file=sys.stderr)
        return 2
    except DiscoveryError as e:
        print(f"phalanx topology discover: {e}", file=sys.stderr)
        return 2
    return _print(topo, args.json)
