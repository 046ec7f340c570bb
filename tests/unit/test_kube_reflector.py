"""The Kubernetes adapter's one list/watch loop (phalanx_kube.reflector), driven without an
API server: what it yields, where each watch resumes, when it lists again."""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pytest

from phalanx_kube import reflector
from phalanx_kube.reflector import Listed, Reflector, Watched


def obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv}}


class FakeApi:
    """Answers each list request with the next of ``pages``, and each watch with the next script
    of (type, object) events; a script ending in an exception breaks the stream."""

    def __init__(self, pages: list[dict], watches: list[list]) -> None:
        self.pages, self.watches = pages, watches
        self.list_calls: list[dict] = []
        self.watched_from: list[str] = []

    async def call(self, what: str, method, **kw):
        self.list_calls.append(kw)
        return 200, self.pages.pop(0)

    async def watch(self, r: Reflector, rv: str):
        self.watched_from.append(rv)
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item


async def acquire() -> None:
    pass


@pytest.mark.anyio
async def test_it_lists_watches_resumes_from_the_last_version_and_lists_again_on_410(monkeypatch):
    monkeypatch.setattr(reflector, "BACKOFF_S", (0.01, 0.02))
    api = FakeApi(
        pages=[{"metadata": {"resourceVersion": "1", "continue": "t"}, "items": [obj("a", "1")]},
               {"metadata": {"resourceVersion": "9"}, "items": [obj("skip", "1"), obj("b", "1")]},
               {"metadata": {"resourceVersion": "20"}, "items": [obj("a", "18")]}],
        watches=[[("ADDED", obj("c", "2")), ("BOOKMARK", obj("", "5"))],           # ends: resume from 5
                 [("MODIFIED", obj("skip", "6")), ("ERROR", {"code": 410})],       # expired: list again
                 [("DELETED", obj("a", "21")), ConnectionError("stream broken")],  # broken: back off, resume
                 [("ADDED", obj("d", "22"))]])
    r = Reflector("things", object(), call=api.call, acquire=acquire, keep=lambda o: o["metadata"]["name"] != "skip")
    monkeypatch.setattr(Reflector, "watch", lambda self, rv: api.watch(self, rv))
    seen = []
    with anyio.fail_after(5):
        async with aclosing(r.changes()) as changes:
            async for change in changes:
                seen.append(change)
                if isinstance(change, Watched) and change.obj["metadata"]["name"] == "d":
                    break
    assert seen == [Listed([obj("a", "1"), obj("b", "1")]), Watched("ADDED", obj("c", "2")),
                    Listed([obj("a", "18")]), Watched("DELETED", obj("a", "21")), Watched("ADDED", obj("d", "22"))]
    assert api.watched_from == ["1", "5", "20", "21"], "each watch starts where the last one left off"
    assert [c.get("_continue") for c in api.list_calls] == [None, "t", None], "pages, then one re-list after 410"
