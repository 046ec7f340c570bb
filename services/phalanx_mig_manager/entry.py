"""Create and destroy MIG instances for pods on one node (answers "not supported" for now)."""

from __future__ import annotations

import os

import anyio

NEEDS_CLUSTER = False


def add_arguments(p) -> None:
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), required=not os.environ.get("NODE_NAME"),
                   help="this node's name (env NODE_NAME)")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_mig_manager.service import run

    await run(bus, args.node, task_status=task_status)
