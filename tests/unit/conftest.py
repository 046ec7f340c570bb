"""Unit-test plumbing: the fuzz tests report how many inputs each target got, and the counts
are printed at the end of the run (``fuzz: validate 10000 inputs, ...``)."""

from __future__ import annotations

import pytest

_COUNTS: dict[str, int] = {}


@pytest.fixture
def fuzz_counts() -> dict[str, int]:
    """Target name -> inputs tried; printed in the terminal summary."""
    return _COUNTS


def pytest_terminal_summary(terminalreporter) -> None:
    if _COUNTS:
        terminalreporter.write_line("fuzz: " + ", ".join(f"{name} {n} inputs" for name, n in sorted(_COUNTS.items())))
