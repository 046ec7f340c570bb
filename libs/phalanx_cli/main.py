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


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command tree; given a command line that names a command, that command's branch
    alone (and for ``run SERVICE``, that service's alone), so a service process imports its own
    service and not every subcommand's and service's modules to build a tree it does not use.
    A line that names no known command gets the whole tree (its help, its errors)."""
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Phalanx: a topology-aware GPU and gang scheduler for Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    named = f"phalanx_cli.cmd_{argv[0]}" if argv and not argv[0].startswith("-") else ""
    for name in COMMANDS:
        if named in COMMANDS and name != named:
            continue
        module = importlib.import_module(name)
        if name == named == "phalanx_cli.cmd_run" and len(argv) > 1:
            module.register(sub, service=argv[1])
        else:
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
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
