"""The architecture is enforced, not just drawn: import-linter contracts, ruff and the type
checker run here (the same commands as ``make lint``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    return str(found) if found.exists() else shutil.which(name) or name


def test_import_contracts_hold():
    proc = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_ruff_finds_nothing():
    proc = subprocess.run([_tool("ruff"), "check", "proto", "libs", "services", "fleet", "tests", "bench"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing():
    """The type checker ([tool.mypy] in pyproject.toml): strict on the wire contract and the
    rulebook, the engine checked, every plugin held to its Protocol where the profile registers
    it. Its cache sits in the environment (``make lint`` uses the same one), so a fresh clone
    needs nothing else; cold it takes a few seconds."""
    cache = Path(sys.prefix) / ".mypy_cache"
    proc = subprocess.run([_tool("mypy"), "--cache-dir", str(cache)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_simulator_and_the_services_define_none_of_the_rulebooks_rules():
    """A rule is written once (libs/phalanx_rules) and called; a function of the same name
    defined by ``phalanx sim`` or a service would be a second copy of it (import-linter cannot
    see a definition, so this looks at the source)."""
    import ast

    rules = {n.name for f in (ROOT / "libs" / "phalanx_rules").glob("*.py")
             for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert {"refusal", "borrowing", "owed", "placement_failed", "wake_order", "preemptor_of"} <= rules
    # Adapters keep the rule's name for the method that calls it (``PlacementQueues.refusal``
    # calls ``queueorder.refusal``): only module-level functions can be copies.
    copies = [f"{f.relative_to(ROOT)}:{n.lineno} {n.name}"
              for where in ("libs/phalanx_sim", "services")
              for f in (ROOT / where).rglob("*.py")
              for n in ast.parse(f.read_text()).body if isinstance(n, ast.FunctionDef) and n.name in rules]
    assert copies == []


def test_make_test_runs_every_tier_directory():
    """``make test`` names its tiers in two lanes (``LANE_BESIDE``, ``LANE_WAITING``): a new
    directory of tests named in neither would never run, one named in both would run twice. The
    integration modules the first lane runs (``INTEGRATION_BESIDE``) exist, lie in a tier of the
    second, and the second lane's command ignores exactly them."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    lanes = {line.split(":=")[0].strip(): line.split(":=")[1].split() for line in text.splitlines()
             if line.startswith(("LANE_BESIDE :=", "LANE_WAITING :=", "INTEGRATION_BESIDE :="))}
    named = lanes["LANE_BESIDE"] + lanes["LANE_WAITING"]
    tiers = {f"tests/{d.name}" for d in (ROOT / "tests").iterdir() if d.is_dir() and any(d.glob("test_*.py"))}
    assert sorted(named) == sorted(tiers), (sorted(tiers - set(named)), named)
    moved = lanes["INTEGRATION_BESIDE"]
    assert moved and all((ROOT / f).is_file() and f.rsplit("/", 1)[0] in lanes["LANE_WAITING"] for f in moved), moved
    assert "$(LANE_WAITING) $(addprefix --ignore=,$(INTEGRATION_BESIDE))" in text
    assert "$(LANE_BESIDE) $(INTEGRATION_BESIDE) >" in text
