"""Orchestrate the gang saga: watch pending pods, admit gangs, drive placement and binding."""

from __future__ import annotations

import anyio

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    p.add_argument("--resync-s", type=float, default=2.0, help="seconds between pod re-lists (default %(default)s)")
    p.add_argument("--redrive-after-s", type=float, default=5.0,
                   help="re-publish the commands of a gang without progress for this long (default %(default)s)")
    p.add_argument("--default-timeout-s", type=float, default=180.0,
                   help="attempt deadline when the pods set no phalanx.io/gang-timeout-seconds (default %(default)s)")
    p.add_argument("--backoff-base-s", type=float, default=1.0, help="first retry delay (default %(default)s)")
    p.add_argument("--backoff-max-s", type=float, default=60.0, help="largest retry delay (default %(default)s)")
    p.add_argument("--settle-s", type=float, default=2.0,
                   help="a gang without min-member starts after no member arrived for this long (default %(default)s)")
    p.add_argument("--starve-after-s", type=float, default=60.0,
                   help="a head-of-line gang waiting this long is protected from starvation; 0 turns it off "
                        "(default %(default)s)")
    p.add_argument("--fairness", choices=("backfill", "strict"), default="backfill",
                   help="how a starving head of the queue is protected: 'backfill' lets later gangs run on nodes "
                        "its placement does not need, 'strict' holds them all back (FIFO) (default %(default)s)")
    p.add_argument("--reconcile-s", type=float, default=5.0,
                   help="seconds between reconciler passes (ledger vs gang records vs bound pods; one replica at a "
                        "time holds its lease); 0 runs no reconciler here (default %(default)s)")
    p.add_argument("--full-resync-s", type=float, default=30.0,
                   help="seconds between resync passes that list the pods from the API server; the passes in "
                        "between replay the pod watch's view (default %(default)s)")
    p.add_argument("--queue-sync-s", type=float, default=2.0,
                   help="seconds between readings of the Queue objects and namespaces (default %(default)s)")
    p.add_argument("--announce-after-s", type=float, default=1.0,
                   help="an attempt still running after this long gets its deadline scheduled and gang.admitted "
                        "published; quicker attempts publish neither (0: every attempt at once) (default %(default)s)")
    p.add_argument("--parallelism", type=int, default=16,
                   help="replies and pod events handled at once; one gang's one at a time, in order "
                        "(default %(default)s)")
    p.add_argument("--tombstone-s", type=float, default=3600.0,
                   help="keep the entry of a gang whose pods are all gone this long, so a gang recreated under "
                        "its id never reuses an attempt number (default %(default)s)")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_gang_coordinator.service import Config, run

    config = Config(resync_s=args.resync_s, redrive_after_s=args.redrive_after_s,
                    default_timeout_s=args.default_timeout_s, backoff_base_s=args.backoff_base_s,
                    backoff_max_s=args.backoff_max_s, settle_s=args.settle_s, starve_after_s=args.starve_after_s,
                    fairness=args.fairness, reconcile_s=args.reconcile_s,
                    tombstone_s=args.tombstone_s, full_resync_s=args.full_resync_s, parallelism=args.parallelism,
                    queue_sync_s=args.queue_sync_s, announce_after_s=args.announce_after_s)
    await run(bus, cluster, config, task_status=task_status)
