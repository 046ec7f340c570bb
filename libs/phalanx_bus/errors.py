"""The bus's errors (shared by the connection, KV and consumer modules)."""

from __future__ import annotations


class BusError(RuntimeError):
    """The bus could not do what was asked (server unreachable past the retry budget, …)."""


class KvConflict(BusError):
    """A compare-and-set lost: the key changed since the revision that was read."""
