"""Publish this node's GPU/NIC topology, heartbeat and extended resources."""

from __future__ import annotations

import os

import anyio

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), required=not os.environ.get("NODE_NAME"),
                   help="this node's name (env NODE_NAME)")
    p.add_argument("--topology-file", default=os.environ.get("PHALANX_TOPOLOGY_FILE"),
                   help="read the topology from an 'nvidia-smi topo -m' or Phalanx YAML file instead of NVML")
    p.add_argument("--gpu-model", default="", help="GPU model for a topology file that does not name it "
                   "(nvidia-smi topo -m prints no model)")
    p.add_argument("--gpu-memory-mib", type=int, default=0, help="GPU memory (MiB) for a topology file without it")
    p.add_argument("--mig-enabled", action="store_true",
                   help="mark the file's MIG-capable GPUs as in MIG mode (NVML reports the real mode)")
    p.add_argument("--heartbeat-s", type=float, default=3.0, help="seconds between heartbeats (default %(default)s)")


def _reader(args):
    if args.topology_file:
        import msgspec

        from phalanx_topology import load_file

        topo = load_file(args.topology_file, node=args.node)
        gpus = tuple(msgspec.structs.replace(g, model=g.model or args.gpu_model,
                                             memory_mib=g.memory_mib or args.gpu_memory_mib,
                                             mig_enabled=g.mig_enabled or args.mig_enabled) for g in topo.gpus)
        topo = msgspec.structs.replace(topo, gpus=gpus)
        return lambda: topo
    from phalanx_nvml import NvmlDiscovery

    nvml = NvmlDiscovery()
    return lambda: nvml.discover(args.node)


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_topology_discovery.service import Config, run

    await run(bus, cluster, Config(node=args.node, heartbeat_s=args.heartbeat_s), _reader(args),
              task_status=task_status)
