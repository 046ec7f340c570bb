"""Simulator only: many simulated nodes' topology-discovery and mig-manager in one process.

``phalanx run node-fleet --cluster-file F`` serves every node of the cluster file (what
``phalanx up`` and the benchmarks start above a few dozen nodes, instead of two processes per
node). It never touches a GPU: MIG nodes get a fake NVML with their model's rules, and the
topology comes from the files the cluster file names. A real node runs its own
``topology-discovery`` and ``mig-manager`` (the DaemonSets in ``deploy/k8s``).
"""

from __future__ import annotations

import anyio

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    p.add_argument("--cluster-file", required=True, help="the simulated nodes (format: examples/clusters/2x8v100.yaml)")
    p.add_argument("--heartbeat-s", type=float, default=3.0, help="seconds between heartbeats (default %(default)s)")
    p.add_argument("--label-refresh-s", type=float, default=30.0,
                   help="seconds between node listings; a label change is reported within this (default %(default)s)")
    p.add_argument("--state-refresh-s", type=float, default=2.0,
                   help="seconds between checks for pod and node changes; the nodes' Kubernetes states are "
                        "reported again after one (default %(default)s)")
    p.add_argument("--reconcile-s", type=float, default=30.0,
                   help="seconds between MIG reconciliation passes of the MIG nodes (default %(default)s)")
    p.add_argument("--orphan-grace-s", type=float, default=60.0,
                   help="an instance owned by nothing is destroyed after this many seconds")
    p.add_argument("--concurrency", type=int, default=64,
                   help="node reports and heartbeats in flight at once (default %(default)s)")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_localstack.stack import ClusterFile
    from phalanx_node_fleet.fleet import FleetConfig, run

    nodes = ClusterFile.load(args.cluster_file).nodes
    config = FleetConfig(heartbeat_s=args.heartbeat_s, label_refresh_s=args.label_refresh_s,
                         state_refresh_s=args.state_refresh_s, reconcile_s=args.reconcile_s,
                         orphan_grace_s=args.orphan_grace_s,
                         concurrency=args.concurrency)
    await run(bus, cluster, nodes, config, task_status=task_status)
