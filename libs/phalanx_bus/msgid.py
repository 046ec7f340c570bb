"""Message ids that no other identity can compute.

JetStream drops a message whose ``Nats-Msg-Id`` it has seen in the stream's duplicate window,
whoever published the first one and on whatever subject of the stream. Phalanx's ids are
idempotency keys built from what the message is about (``GangEvent.key``: tag, gang, attempt,
pod uids), and the uids are readable by node agents and subscribers; so a node agent could
publish junk on its own subject under the id of another node's next command, and the real
command would be dropped as a duplicate.

Of the three ways out (a stream per publisher, handlers that need no de-duplication, or ids
others cannot compute), Phalanx takes the third: each id is the readable key followed by
``~`` and a MAC of it under a key derived from the publisher's own credential seed (HMAC-SHA256,
truncated to 128 bits). Replicas of one identity share the credential, so they compute the
same id for the same command (a re-drive after a crash is still de-duplicated); no other
identity holds that seed. Per-publisher streams would need a stream per node for replies, and
dropping de-duplication would double every redelivered command's work. Without a credential
(a bus without authentication) ids are the plain keys: there is nobody to tell apart.
"""

from __future__ import annotations

import hashlib
import hmac

SEPARATOR = "~"
_CONTEXT = b"phalanx Nats-Msg-Id v1"


class MsgIds:
    """Turns an idempotency key into this identity's message id."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes | None) -> None:
        self._key = hmac.new(secret, _CONTEXT, hashlib.sha256).digest() if secret else None

    @classmethod
    def from_seed(cls, seed: str | None) -> MsgIds:
        return cls(seed.encode() if seed else None)

    def __call__(self, key: str) -> str:
        if self._key is None:
            return key
        mac = hmac.new(self._key, key.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{key}{SEPARATOR}{mac}"

    @property
    def signed(self) -> bool:
        return self._key is not None


def readable(msg_id: str) -> str:
    """The idempotency key inside a message id (for logs and spans)."""
    return msg_id.rsplit(SEPARATOR, 1)[0]
