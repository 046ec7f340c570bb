"""Simulator only: many simulated nodes' topology-discovery and mig-manager in one process.

``phalanx run node-fleet --cluster-file F`` serves every node of the cluster file (what
``phalanx up`` and the benchmarks start above a few dozen nodes, instead of two processes per
node). It never touches a GPU: MIG nodes get a fake NVML with their model's rules, and the
topology comes from the files the cluster file names. A real node runs its own
``topology-discovery`` and ``mig-manager`` (the DaemonSets in ``deploy/k8s``).
"""

from __future__ import annotations

import anyio

from phalanx_service.config import add_arguments as _flags
from phalanx_service.config import from_args

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    from phalanx_node_fleet.fleet import Config

    _flags(p, Config)


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_node_fleet.fleet import Config, run

    await run(bus, cluster, from_args(Config, args), task_status=task_status)
