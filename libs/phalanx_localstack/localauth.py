"""The keys, CA and credentials of a local stack, kept in one directory.

``phalanx up``/``phalanx demo`` make one per run (inside the stack's temp dir); the test
session makes one and exports ``PHALANX_BUS_SECRETS_DIR`` plus the admin identity
(``PHALANX_NATS_CREDS``, ``PHALANX_NATS_CA``), so every ``NatsServer`` and ``Stack`` of the
session trusts the same operator and every ``Bus.connect`` without explicit credentials is the
admin. ``Stack`` gives each service process its own identity with ``env()``.

Layout: ``ca.pem``/``server.pem``/``server-key.pem``, ``creds/<identity>[@node,...].creds``
minted on first use, and — only for a bundle other processes load (the test session's) —
``keys.json`` with the seeds (mode 0600). ``phalanx up`` keeps the operator, account and
signing seeds in its own memory: nothing on disk mints a credential, so a process of the same
user that reads the stack's directory finds user credentials, never the keys behind them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from phalanx_bus.credentials import KeySet
from phalanx_bus.tlsca import TlsFiles, make_ca_and_server_cert

ENV_DIR = "PHALANX_BUS_SECRETS_DIR"
ENV_CREDS = "PHALANX_NATS_CREDS"
ENV_CA = "PHALANX_NATS_CA"


@dataclass(frozen=True)
class LocalSecurity:
    directory: Path
    keys: KeySet
    tls: TlsFiles

    @classmethod
    def create(cls, directory: str | os.PathLike, *, keep_keys: bool = False) -> LocalSecurity:
        """Fresh keys and a throwaway CA in ``directory`` (created). The seeds stay in memory
        unless ``keep_keys`` (then ``keys.json``, for other processes to ``load``)."""
        d = Path(directory)
        (d / "creds").mkdir(parents=True, exist_ok=True)
        keys = KeySet.generate()
        if keep_keys:
            key_file = d / "keys.json"
            key_file.touch(mode=0o600)
            key_file.write_text(keys.to_json())
        return cls(d, keys, make_ca_and_server_cert(d))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> LocalSecurity:
        d = Path(directory)
        return cls(d, KeySet.from_json((d / "keys.json").read_text()),
                   TlsFiles(d / "ca.pem", d / "server.pem", d / "server-key.pem"))

    @classmethod
    def from_env(cls) -> LocalSecurity | None:
        """The session's bundle when ``PHALANX_BUS_SECRETS_DIR`` names one, else ``None``."""
        d = os.environ.get(ENV_DIR)
        return cls.load(d) if d else None

    def creds(self, identity: str, nodes: tuple[str, ...] = ()) -> Path:
        """The ``.creds`` file of ``identity`` (for ``nodes``, if a node agent), minted once."""
        path = self.directory / "creds" / (identity + (f"@{','.join(nodes)}" if nodes else "") + ".creds")
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.touch(mode=0o600)
            tmp.write_text(self.keys.user_creds(identity, nodes))
            tmp.replace(path)
        return path

    def env(self, identity: str, nodes: tuple[str, ...] = ()) -> dict[str, str]:
        """Environment that makes ``Bus.connect`` use ``identity`` over TLS."""
        return {ENV_CREDS: str(self.creds(identity, nodes)), ENV_CA: str(self.tls.ca)}

    def server_config(self) -> str:
        """Auth (operator, accounts) and client TLS blocks of a nats-server configuration."""
        return (self.keys.server_config()
                + f"tls {{\n  cert_file: {conf_string(self.tls.cert)}\n  key_file: {conf_string(self.tls.key)}\n"
                  f"  ca_file: {conf_string(self.tls.ca)}\n  timeout: 5\n}}\n")

    def route_tls(self) -> str:
        """The ``tls`` block of a ``cluster`` section: mutual TLS between the servers."""
        return (f"  tls {{\n    cert_file: {conf_string(self.tls.cert)}\n    key_file: {conf_string(self.tls.key)}\n"
                f"    ca_file: {conf_string(self.tls.ca)}\n    verify: true\n    timeout: 5\n  }}\n")


def conf_string(p: os.PathLike | str) -> str:
    return '"' + str(p).replace("\\", "\\\\").replace('"', '\\"') + '"'
