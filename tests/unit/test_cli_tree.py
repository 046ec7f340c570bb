"""The ``phalanx`` command tree (libs/phalanx_cli/main.py): a command line that names a command
builds that command's branch alone, and ``run SERVICE`` that service's alone, so a service
process imports no other service; any other line gets the whole tree."""

from __future__ import annotations

import subprocess
import sys

from phalanx_cli import cmd_run
from phalanx_cli.main import COMMANDS, build_parser


def commands(parser) -> set[str]:
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return set(sub.choices)


def services(parser) -> set[str]:
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    (svc,) = [a for a in sub.choices["run"]._actions if a.dest == "service"]
    return set(svc.choices)


def test_a_line_naming_no_known_command_gets_every_command_and_every_service():
    every = {m.removeprefix("phalanx_cli.cmd_") for m in COMMANDS} | {"demo"}
    for argv in (None, [], ["--help"], ["nosuch"]):
        assert commands(build_parser(argv)) == every, argv
    for argv in (["run"], ["run", "--help"], ["run", "nosuch"]):
        assert services(build_parser(argv)) == set(cmd_run.SERVICES), argv


def test_a_line_naming_a_command_or_a_service_gets_that_branch_alone():
    assert commands(build_parser(["explain", "default/p"])) == {"explain"}
    parser = build_parser(["run", "placement", "--nats", "nats://x"])
    assert (commands(parser), services(parser)) == ({"run"}, {"placement"})
    assert parser.parse_args(["run", "placement", "--nats", "nats://x"]).entry_module == cmd_run.SERVICES["placement"]


def test_a_service_process_imports_no_other_service():
    code = ("import sys; from phalanx_cli.main import build_parser; build_parser(['run', 'placement']); "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "{'phalanx_binder', 'phalanx_gang_coordinator', 'phalanx_mig_manager', 'phalanx_topology_discovery', "
            "'phalanx_placement'}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "['phalanx_placement']"
