"""The API server's timestamps (RFC 3339, UTC) to and from Unix seconds, for the real
Kubernetes adapter's modules."""

from __future__ import annotations

import datetime as dt


def iso(t: float, micro: bool = False) -> str:
    """``2026-01-01T00:00:00Z`` (``micro``: with microseconds, as ``MicroTime`` fields need)."""
    d = dt.datetime.fromtimestamp(t, dt.UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def epoch(s: str | None) -> float:
    """Unix seconds of a timestamp; 0.0 for none or an unreadable one."""
    if not s:
        return 0.0
    try:
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
