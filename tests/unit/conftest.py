"""Unit-test plumbing: the Hypothesis profiles of the fuzz tests, and the count of inputs each
fuzz target got, printed at the end of the run (``fuzz: validate 4000 inputs, ...``).

Profiles (chosen with ``PHALANX_FUZZ_PROFILE``):

* ``phalanx`` (default, ``make test``): ``PHALANX_FUZZ_EXAMPLES`` inputs per target (4000),
  derandomized: every run tries the same inputs, so the suite does not flake on a new one; a
  failure is shrunk and printed with the ``@reproduce_failure`` blob that replays it;
* ``fuzz`` (``make fuzz``): 200000 inputs per target (or ``PHALANX_FUZZ_EXAMPLES``) from a fresh
  seed each run, with the example database in ``.hypothesis/examples``: a failure found once is replayed
  first on every later run until it is fixed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_COUNTS: dict[str, int] = {}
_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
_examples = os.environ.get("PHALANX_FUZZ_EXAMPLES")

settings.register_profile("phalanx", max_examples=int(_examples or 4000), derandomize=True, deadline=None,
                          print_blob=True, suppress_health_check=_SLOW_IS_FINE)
settings.register_profile("fuzz", max_examples=int(_examples or 200000), deadline=None, print_blob=True,
                          database=DirectoryBasedExampleDatabase(Path(__file__).resolve().parents[2] / ".hypothesis" / "examples"),
                          suppress_health_check=_SLOW_IS_FINE)
settings.load_profile(os.environ.get("PHALANX_FUZZ_PROFILE", "phalanx"))


@pytest.fixture
def fuzz_counts() -> dict[str, int]:
    """Target name -> inputs tried; printed in the terminal summary."""
    return _COUNTS


def pytest_terminal_summary(terminalreporter) -> None:
    if _COUNTS:
        terminalreporter.write_line("fuzz: " + ", ".join(f"{name} {n} inputs" for name, n in sorted(_COUNTS.items())))
