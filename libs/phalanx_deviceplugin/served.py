"""What the plugin served, kept in a file on the node so a restarted plugin (or a rebooted
node whose kubelet admits its pods again) knows it.

One record per pod: uid, namespace/name, the assignment digest it was served under, and the
device IDs per resource. ``PreStartContainer`` checks the kubelet's device→pod mapping against
these records; a re-admission of a served pod is vouched for by its record when binder's fence
entry is gone. Writes are atomic (temp file + rename) and done before ``Allocate`` answers.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

MAX_RECORDS = 4096
"""Oldest records go first past this (a node never runs that many pods at once)."""


class Served(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str
    digest: str
    devices: dict[str, tuple[str, ...]] = {}
    at: float = 0.0


_decoder = msgspec.json.Decoder(list[Served])
_encoder = msgspec.json.Encoder()


class ServedStore:
    """Records by pod uid, mirrored to ``path`` (None: memory only, for tests)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._by_uid: dict[str, Served] = {}
        if self.path is not None and self.path.exists():
            try:
                self._by_uid = {s.uid: s for s in _decoder.decode(self.path.read_bytes())}
            except (msgspec.DecodeError, msgspec.ValidationError):
                self._by_uid = {}  # unreadable: start empty; re-admissions then need the fence

    def get(self, uid: str) -> Served | None:
        return self._by_uid.get(uid)

    def all(self) -> list[Served]:
        return sorted(self._by_uid.values(), key=lambda s: s.at)

    def add(self, *, uid: str, namespace: str, name: str, digest: str, resource: str, ids: list[str],
            at: float) -> Served:
        """Record ``ids`` of ``resource`` as served to the pod (added to what it had)."""
        old = self._by_uid.get(uid)
        devices = dict(old.devices) if old and old.digest == digest else {}
        devices[resource] = tuple(sorted(set(devices.get(resource, ())) | set(ids)))
        rec = Served(uid=uid, namespace=namespace, name=name, digest=digest, devices=devices, at=at)
        self._by_uid[uid] = rec
        if len(self._by_uid) > MAX_RECORDS:
            for s in self.all()[:len(self._by_uid) - MAX_RECORDS]:
                del self._by_uid[s.uid]
        self._save()
        return rec

    def owner(self, resource: str, ids: list[str]) -> Served | None:
        """The record that was served every one of ``ids`` for ``resource``, if any."""
        want = set(ids)
        for s in self._by_uid.values():
            if want and want <= set(s.devices.get(resource, ())):
                return s
        return None

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(_encoder.encode(self.all()))
        os.replace(tmp, self.path)
