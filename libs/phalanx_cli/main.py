"""The ``phalanx`` command line: one argparse tree, each subcommand in its own module.

Every subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed args and returning an exit code). Exit codes:
0 success, 1 "the answer is no" (a file that was read but is invalid, nothing fits), 2 bad
input (a file that cannot be read, bad flags, a server that does not answer).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order ``phalanx --help`` lists them.
COMMANDS = [
    "phalanx_cli.cmd_up",
    "phalanx_cli.cmd_run",
    "phalanx_cli.cmd_schema",
    "phalanx_cli.cmd_validate",
    "phalanx_cli.cmd_place",
    "phalanx_cli.cmd_topology",
    "phalanx_cli.cmd_explain",
    "phalanx_cli.cmd_sim",
    "phalanx_cli.cmd_doctor",
    "phalanx_cli.cmd_queues",
    "phalanx_cli.cmd_events",
    "phalanx_cli.cmd_asyncapi",
    "phalanx_cli.cmd_bus",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Phalanx: a topology-aware GPU and gang scheduler for Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
