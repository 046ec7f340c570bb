"""The simulated cluster's Queue objects and namespaces (KV ``phx-sim-queues`` and
``phx-sim-namespaces``): the part of ``ClusterPort`` that gang-coordinator's queue book reads,
and what ``phalanx up --queues`` and the tests load. ``KvCluster`` mixes it in; the buckets
are opened on first use (only the simulator and gang-coordinator may open them)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from phalanx_bus import KvConflict
from phalanx_proto import subjects as S
from phalanx_proto.queues import queue_key

_json = msgspec.json.Encoder()


class KvQueues:
    """Needs ``self._bus`` (``KvCluster``)."""

    async def _kv(self, bucket: str):
        return await self._bus.kv(bucket, history=2)  # type: ignore[attr-defined]

    async def apply_queue(self, obj: dict[str, Any]) -> None:
        """Create or replace a Queue object (as ``kubectl apply``; its status is kept)."""
        kv = await self._kv(S.KV_SIM_QUEUES)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = queue_key(str(meta.get("name", "")))
        old = await kv.get(key)
        if old is not None:
            prior = msgspec.json.decode(old.value)
            obj["status"] = prior.get("status") or {}
            meta["generation"] = int((prior.get("metadata") or {}).get("generation") or 1) + 1
        else:
            meta["generation"] = 1
        await kv.put(key, _json.encode(obj))

    async def delete_queue(self, name: str) -> None:
        await (await self._kv(S.KV_SIM_QUEUES)).delete(queue_key(name))

    async def apply_namespace(self, name: str, labels: dict[str, str]) -> None:
        await (await self._kv(S.KV_SIM_NAMESPACES)).put(queue_key(name), _json.encode(
            {"metadata": {"name": name, "labels": labels}}))

    async def list_queues(self) -> list[dict[str, Any]]:
        return [msgspec.json.decode(e.value) for e in await (await self._kv(S.KV_SIM_QUEUES)).items()]

    async def list_namespaces(self) -> dict[str, dict[str, str]]:
        out = {}
        for e in await (await self._kv(S.KV_SIM_NAMESPACES)).items():
            out[(msgspec.json.decode(e.value).get("metadata") or {}).get("name", "")] = _labels(e.value)
        return out

    async def get_namespace(self, name: str) -> dict[str, str] | None:
        """A simulated namespace exists implicitly: one never applied has no labels."""
        entry = await (await self._kv(S.KV_SIM_NAMESPACES)).get(queue_key(name))
        return {} if entry is None else _labels(entry.value)

    async def watch_namespaces(self) -> AsyncIterator[dict[str, dict[str, str]]]:
        while True:
            known: dict[str, dict[str, str]] = {}
            listed = False
            try:
                async for entry in (await self._kv(S.KV_SIM_NAMESPACES)).watch():
                    if entry is None:
                        listed = True
                        yield dict(known)
                        continue
                    meta_name = entry.key
                    if entry.deleted:
                        known = {n: v for n, v in known.items() if queue_key(n) != meta_name}
                    else:
                        obj = msgspec.json.decode(entry.value).get("metadata") or {}
                        known[obj.get("name", "")] = dict(obj.get("labels") or {})
                    if listed:
                        yield dict(known)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - watch broke (server restart): list again
                await asyncio.sleep(0.5)

    async def update_queue_status(self, name: str, status: dict[str, Any]) -> None:
        kv = await self._kv(S.KV_SIM_QUEUES)
        for _ in range(10):
            entry = await kv.get(queue_key(name))
            if entry is None:
                return
            obj = msgspec.json.decode(entry.value)
            obj["status"] = status
            try:
                await kv.update(entry.key, _json.encode(obj), last=entry.revision)
                return
            except KvConflict:
                continue


def _labels(raw: bytes) -> dict[str, str]:
    return dict((msgspec.json.decode(raw).get("metadata") or {}).get("labels") or {})
