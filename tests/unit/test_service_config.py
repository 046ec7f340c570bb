"""Each service's configuration is said once (phalanx_service.config): its flags come from its
Config's fields, their defaults are the fields' defaults, and the value comes back whole."""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from phalanx_service.config import add_arguments, from_args, option, required, whole_number


@dataclasses.dataclass(frozen=True)
class Toy:
    node: str = required("this node's name", env="TOY_NODE")
    rate_s: float = option(2.0, "seconds between passes")
    mode: str = option("auto", "how", choices=("auto", "strict"), env="TOY_MODE")
    cdi: bool = option(True, "name GPUs by env var", flag="--no-cdi")
    verbose: bool = option(False, "say more")
    width: int = option(16, "at once", parse=whole_number(1, 64))
    knob: int = 3


def parse(argv: list[str]) -> Toy:
    p = argparse.ArgumentParser()
    add_arguments(p, Toy)
    return from_args(Toy, p.parse_args(argv))


def test_every_field_but_a_knob_is_a_flag_with_the_fields_default(monkeypatch):
    monkeypatch.delenv("TOY_NODE", raising=False)
    monkeypatch.delenv("TOY_MODE", raising=False)
    assert parse(["--node", "n1"]) == Toy(node="n1")
    assert parse(["--node", "n1", "--rate-s", "0.5", "--mode", "strict", "--no-cdi", "--verbose", "--width", "8"]) == \
        Toy(node="n1", rate_s=0.5, mode="strict", cdi=False, verbose=True, width=8)


def test_an_environment_variable_is_the_default_and_satisfies_a_required_flag(monkeypatch):
    monkeypatch.setenv("TOY_NODE", "from-env")
    monkeypatch.setenv("TOY_MODE", "strict")
    assert parse([]) == Toy(node="from-env", mode="strict")


@pytest.mark.parametrize(("argv", "error"), [
    ([], "the following arguments are required: --node"),
    (["--node", "n", "--mode", "lax"], "invalid choice: 'lax'"),
    (["--node", "n", "--width", "65"], "'65' must be a whole number from 1 to 64"),
], ids=["a required flag missing", "a value outside the choices", "a value the parser refuses"])
def test_a_flag_refuses_what_its_field_cannot_hold(argv, error, monkeypatch, capsys):
    monkeypatch.delenv("TOY_NODE", raising=False)
    with pytest.raises(SystemExit):
        parse(argv)
    assert error in capsys.readouterr().err


@pytest.mark.parametrize(("entry", "service", "given"), [
    ("phalanx_topology_discovery.entry", "phalanx_topology_discovery.service", {"node": "n1"}),
    ("phalanx_gang_coordinator.entry", "phalanx_gang_coordinator.service", {}),
    ("phalanx_placement.entry", "phalanx_placement.service", {}),
    ("phalanx_mig_manager.entry", "phalanx_mig_manager.service", {"node": "n1"}),
    ("phalanx_binder.entry", "phalanx_binder.service", {}),
])
def test_a_service_run_without_flags_gets_its_configs_defaults(entry, service, given, monkeypatch):
    for var in ("NODE_NAME", "POD_NAMESPACE", "PHALANX_BIND_PARALLELISM", "PHALANX_ADVERTISE", "PHALANX_MIG_NVML",
                "PHALANX_TOPOLOGY_FILE", "PHALANX_DEVICE_PLUGIN_DIR", "PHALANX_POD_RESOURCES_SOCKET",
                "PHALANX_STATE_DIR", "PHALANX_SYSFS_ROOT"):
        monkeypatch.delenv(var, raising=False)
    config = importlib.import_module(service).Config
    p = argparse.ArgumentParser()
    importlib.import_module(entry).add_arguments(p)
    argv = [a for k, v in given.items() for a in (f"--{k}", v)]
    assert from_args(config, p.parse_args(argv)) == config(**given)
