"""Decide where gangs go and reserve their GPUs in the ledger."""

from __future__ import annotations

import anyio

NEEDS_CLUSTER = False


def add_arguments(p) -> None:
    p.add_argument("--heartbeat-stale-s", type=float, default=15.0,
                   help="a node whose topology heartbeat is older than this is unavailable (default %(default)s)")
    p.add_argument("--node-state", choices=("auto", "required", "optional"), default="auto",
                   help="when a node whose agent has not reported its Kubernetes state takes nothing: 'auto' once "
                   "reports have flowed for --node-state-grace-s (default), always, or never (docs/placement.md)")
    p.add_argument("--node-state-grace-s", type=float, default=30.0,
                   help="seconds of reports before 'auto' refuses unreported nodes (default %(default)s)")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_placement.service import Config, run

    await run(bus, Config(heartbeat_stale_s=args.heartbeat_stale_s,
                          node_state=args.node_state, node_state_grace_s=args.node_state_grace_s), task_status=task_status)
