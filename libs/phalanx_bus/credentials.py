"""NATS decentralised auth for Phalanx: an operator, one account, one scoped signing key per
identity, and user credentials minted from them (docs/security.md says why JWTs and not a
static list of NKeys).

The server trusts the operator and preloads two account JWTs (``SYS`` and ``PHALANX``). The
``PHALANX`` account JWT carries, for every identity of ``phalanx_proto.subjects.IDENTITIES``
except ``admin``, a *scoped* signing key whose permission template is that identity's
permissions (``phalanx_bus.permissions``). A user JWT signed by a scoped key gets exactly the
key's template, whatever it claims; node agents' templates say ``{{tag(node)}}``, so one
signing key mints a credential for any node (or a listed set of nodes, for a simulated fleet)
without touching the server. ``admin`` is signed by the account key itself with no limits.

Used by ``phalanx bus`` (keys, creds, server config), ``phalanx up`` and the test fixtures.
JWTs are built here (header ``ed25519-nkey``, claims version 2, as nats-server reads them);
nats-py has no minting API.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys

from phalanx_bus.permissions import permissions
from phalanx_proto import subjects as S

ACCOUNT_NAME = "PHALANX"
SYSTEM_ACCOUNT_NAME = "SYS"
_UNLIMITED = {"subs": -1, "data": -1, "payload": -1}
_PREFIX = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
           "user": nkeys.PREFIX_BYTE_USER}


class CredentialsError(ValueError):
    """Bad key material or a request the table does not allow (unknown identity, missing node)."""


def new_seed(kind: str) -> str:
    """A fresh NKey seed (``SO…``, ``SA…``, ``SU…``) for an operator, account or user key."""
    return nkeys.encode_seed(os.urandom(32), _PREFIX[kind]).decode()


def public_key(seed: str) -> str:
    return nkeys.from_seed(seed.encode()).public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode_jwt(claims: dict, signer_seed: str) -> str:
    """Sign ``claims`` (with ``iss``, ``iat`` and ``jti`` filled in) as a NATS v2 JWT."""
    kp = nkeys.from_seed(signer_seed.encode())
    body = {**claims, "iss": kp.public_key.decode(), "iat": int(time.time())}
    body["jti"] = base64.b32encode(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = kp.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


def decode_jwt_claims(token: str) -> dict:
    """The claims of a JWT, unverified (the server verifies; this is for reading names and tags)."""
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError) as e:
        raise CredentialsError(f"not a JWT: {e}") from e


def _allow(subjects: tuple[str, ...]) -> dict:
    """A permission that allows exactly ``subjects``: an empty NATS allow-list means
    *everything*, so nothing to allow is written as denying all."""
    return {"allow": list(subjects)} if subjects else {"deny": [">"]}


def creds_text(user_jwt: str, seed: str) -> str:
    """A ``.creds`` file: the user JWT and its seed, in the layout every NATS client reads."""
    return ("-----BEGIN NATS USER JWT-----\n" f"{user_jwt}\n" "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n" f"{seed}\n" "------END USER NKEY SEED------\n\n"
            "*************************************************************\n")


def read_creds_jwt(path: str | os.PathLike) -> str:
    """The user JWT of a ``.creds`` file."""
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if "BEGIN NATS USER JWT" in line and i + 1 < len(lines):
            return lines[i + 1].strip()
    raise CredentialsError(f"{path}: no NATS user JWT in it")


def read_creds_seed(path: str | os.PathLike) -> str:
    """The user NKey seed of a ``.creds`` file (never logged or printed)."""
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if "BEGIN USER NKEY SEED" in line and i + 1 < len(lines):
            return lines[i + 1].strip()
    raise CredentialsError(f"{path}: no user NKey seed in it")


@dataclass(frozen=True)
class KeySet:
    """Every seed Phalanx's auth needs. The operator and account seeds are the root of trust:
    keep them offline (docs/security.md, "Keys"); only signing keys mint user credentials."""

    operator: str
    system_account: str
    account: str
    signing: dict[str, str]
    """identity → account signing key seed (scoped)."""

    @classmethod
    def generate(cls) -> KeySet:
        return cls(new_seed("operator"), new_seed("account"), new_seed("account"),
                   {name: new_seed("account") for name in S.IDENTITIES if name != S.ADMIN})

    def to_json(self) -> str:
        return json.dumps({"operator": self.operator, "system_account": self.system_account,
                           "account": self.account, "signing": self.signing}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KeySet:
        try:
            d = json.loads(text)
            keys = cls(d["operator"], d["system_account"], d["account"], dict(d["signing"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CredentialsError(f"key file: {e}") from e
        missing = sorted(set(S.IDENTITIES) - {S.ADMIN} - set(keys.signing))
        if missing:
            raise CredentialsError(f"key file: no signing key for {', '.join(missing)}")
        return keys

    def rotate(self, identity: str) -> KeySet:
        """The same keys with a new signing key for ``identity``: once the account JWT of the
        result is on the server, every credential minted with the old key stops working."""
        return KeySet(self.operator, self.system_account, self.account,
                      {**self.signing, identity: new_seed("account")})

    # -- JWTs ---------------------------------------------------------------------------
    def operator_jwt(self) -> str:
        return encode_jwt({"sub": public_key(self.operator), "name": "phalanx",
                           "nats": {"system_account": public_key(self.system_account),
                                    "type": "operator", "version": 2}}, self.operator)

    def system_account_jwt(self) -> str:
        return encode_jwt({"sub": public_key(self.system_account), "name": SYSTEM_ACCOUNT_NAME,
                           "nats": {"limits": {**_UNLIMITED, "imports": -1, "exports": -1, "wildcards": True,
                                               "conn": -1, "leaf": -1},
                                    "default_permissions": {"pub": {}, "sub": {}},
                                    "type": "account", "version": 2}}, self.operator)

    def account_jwt(self) -> str:
        """The PHALANX account: JetStream enabled within the table's storage limit, one scoped
        signing key per identity whose template is that identity's permissions from the bus
        table (a node agent's messages also capped at ``NODE_AGENT_PAYLOAD_MAX``)."""
        scopes = []
        for name, seed in sorted(self.signing.items()):
            perms = permissions(name)
            limits = {**_UNLIMITED, "payload": S.NODE_AGENT_PAYLOAD_MAX} if S.IDENTITIES[name].per_node else _UNLIMITED
            scopes.append({"kind": "user_scope", "key": public_key(seed), "role": name,
                           "description": S.IDENTITIES[name].description,
                           "template": {"pub": _allow(perms.publish), "sub": _allow(perms.subscribe),
                                        **limits}})
        # JetStream storage is bounded for the whole account (docs/security.md, "Storage limits"):
        # at most ACCOUNT_MAX_STREAMS streams, each required to declare its size.
        limits = {**_UNLIMITED, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1,
                  "mem_storage": 256 * S.MIB, "disk_storage": -1, "streams": S.ACCOUNT_MAX_STREAMS,
                  "consumer": -1, "max_bytes_required": True}
        return encode_jwt({"sub": public_key(self.account), "name": ACCOUNT_NAME,
                           "nats": {"limits": limits, "signing_keys": scopes,
                                    "default_permissions": {"pub": {}, "sub": {}},
                                    "type": "account", "version": 2}}, self.operator)

    def user_creds(self, identity: str, nodes: tuple[str, ...] = (), *, seed: str | None = None) -> str:
        """A ``.creds`` file for ``identity``. A node agent names its node(s): one for a real
        node, several for a simulated fleet (the server expands its template for each)."""
        if identity not in S.IDENTITIES:
            raise CredentialsError(f"unknown identity {identity!r}; known: {', '.join(S.IDENTITIES)}")
        per_node = S.IDENTITIES[identity].per_node
        if per_node and not nodes:
            raise CredentialsError(f"{identity} is a node agent: name its node(s)")
        if nodes and not per_node:
            raise CredentialsError(f"{identity} is not a node agent: it takes no node")
        user_seed = seed or new_seed("user")
        name = identity if not nodes else f"{identity}@{','.join(nodes)}"
        nats: dict = {"type": "user", "version": 2}
        if identity == S.ADMIN:
            nats.update({"pub": {}, "sub": {}, **_UNLIMITED})
            signer = self.account
        else:
            nats.update({"issuer_account": public_key(self.account)})
            if nodes:
                nats["tags"] = [f"node:{S.token(n)}" for n in nodes]
            signer = self.signing[identity]
        jwt = encode_jwt({"sub": public_key(user_seed), "name": name, "nats": nats}, signer)
        return creds_text(jwt, user_seed)

    def server_config(self) -> str:
        """The nats-server configuration fragment that trusts this operator (memory resolver
        with both accounts preloaded)."""
        sys_pub, acc_pub = public_key(self.system_account), public_key(self.account)
        return (f"operator: {json.dumps(self.operator_jwt())}\n"
                f"system_account: {sys_pub}\n"
                "resolver: MEMORY\n"
                "resolver_preload: {\n"
                f"  {sys_pub}: {json.dumps(self.system_account_jwt())}\n"
                f"  {acc_pub}: {json.dumps(self.account_jwt())}\n"
                "}\n")
