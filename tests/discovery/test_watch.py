"""The generic list/watch helper against the fake API server: every recovery rule, through the real client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator

import pytest

from epp.discovery.kubernetes.rest import KubeRest, ResourceRef
from epp.discovery.kubernetes.watch import Changed, Listed, ObjectCache, WatchItem, WatchOptions, watch_objects
from tests.discovery.k8s_objects import pod
from tests.fakes.apiserver import FakeApiServer, Resource

PODS = ResourceRef("", "v1", "pods", namespace="default")
FAST = WatchOptions(inactivity_timeout_s=5.0, backoff_initial_s=0.05, backoff_max_s=0.2, absent_retry_s=0.2)


class Follower:
    """Runs watch_objects in a task, folding items into a cache; `until` waits for a condition (bounded)."""

    def __init__(self, rest: KubeRest, ref: ResourceRef, options: WatchOptions = FAST) -> None:
        self.cache = ObjectCache()
        self.items: list[WatchItem] = []
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._run(watch_objects(rest, ref, options)))

    async def _run(self, stream: AsyncIterator[WatchItem]) -> None:
        async for item in stream:
            self.items.append(item)
            self.cache.apply(item)
            self._changed.set()

    def names(self) -> set[str]:
        return {name for _, name in self.cache.objects}

    async def until(self, predicate, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():  # predicates may read the server's state too: re-check every 20 ms
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.02)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def lists(self) -> int:
        return sum(isinstance(i, Listed) for i in self.items)


@pytest.fixture
async def follow(rest: KubeRest):
    followers: list[Follower] = []

    def start(ref: ResourceRef = PODS, options: WatchOptions = FAST) -> Follower:
        f = Follower(rest, ref, options)
        followers.append(f)
        return f

    yield start
    for f in followers:
        await f.stop()


async def test_lists_then_streams_added_modified_deleted(apiserver: FakeApiServer, follow) -> None:
    apiserver.apply(pod("a", ip="127.10.0.1"))
    f = follow()
    await f.until(lambda: f.names() == {"a"})
    apiserver.apply(pod("b", ip="127.10.0.2"))
    apiserver.apply(pod("a", ip="127.10.0.3"))
    apiserver.delete("v1", "Pod", "default", "b")
    await f.until(lambda: [i.type for i in f.items if isinstance(i, Changed)] == ["ADDED", "MODIFIED", "DELETED"])
    assert f.cache.objects[("default", "a")]["status"]["podIP"] == "127.10.0.3"
    assert f.names() == {"a"}
    assert isinstance(f.items[0], Listed) and f.items[0].objects[0]["kind"] == "Pod"


async def test_cluster_scoped_custom_objects_are_watched(apiserver: FakeApiServer, follow) -> None:
    apiserver.register(Resource("federation.llmkube.dev", "v1alpha1", "federatedclusters", "FederatedCluster", False))
    site = {"apiVersion": "federation.llmkube.dev/v1alpha1", "kind": "FederatedCluster", "metadata": {"name": "eu"}}
    apiserver.apply(site)
    f = follow(ResourceRef("federation.llmkube.dev", "v1alpha1", "federatedclusters"))
    await f.until(lambda: f.names() == {"eu"})
    apiserver.apply({**site, "metadata": {"name": "us"}})
    await f.until(lambda: f.names() == {"eu", "us"})
    assert ("", "us") in f.cache.objects


async def test_dropped_stream_resumes_from_last_version_without_relisting(apiserver: FakeApiServer, follow) -> None:
    f = follow()
    await f.until(lambda: f.cache.listed and apiserver.open_watches() == 1)
    apiserver.drop_watches()
    apiserver.apply(pod("late", ip="127.10.0.9"))
    await f.until(lambda: f.names() == {"late"})
    assert f.lists() == 1
    assert [c.verb for c in apiserver.calls].count("list") == 1


async def test_gone_forces_relist_that_removes_what_was_deleted_in_the_gap(apiserver: FakeApiServer, follow) -> None:
    apiserver.apply(pod("keep", ip="127.10.0.1"))
    apiserver.apply(pod("gone", ip="127.10.0.2"))
    f = follow()
    await f.until(lambda: f.names() == {"keep", "gone"} and apiserver.open_watches() == 1)
    apiserver.hold_watches()
    apiserver.drop_watches()
    apiserver.delete("v1", "Pod", "default", "gone")
    apiserver.compact()
    apiserver.release_watches()
    await f.until(lambda: f.names() == {"keep"})
    assert f.lists() == 2


async def test_silent_stream_is_noticed_by_the_inactivity_timeout(apiserver: FakeApiServer, follow) -> None:
    f = follow(options=WatchOptions(inactivity_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.1))
    await f.until(lambda: f.cache.listed and apiserver.open_watches() == 1)
    apiserver.freeze_watches()
    apiserver.apply(pod("unseen-until-reconnect", ip="127.10.0.4"))
    await f.until(lambda: f.names() == {"unseen-until-reconnect"})
    assert f.lists() == 1  # resumed from the last resourceVersion; history had the event


async def test_bookmarks_are_consumed_not_yielded(apiserver: FakeApiServer, follow) -> None:
    f = follow()
    await f.until(lambda: f.cache.listed and apiserver.open_watches() == 1)
    apiserver.send_bookmarks()
    apiserver.apply(pod("after-bookmark", ip="127.10.0.5"))
    await f.until(lambda: f.names() == {"after-bookmark"})
    assert all(isinstance(i, Listed) or i.type != "BOOKMARK" for i in f.items)


async def test_uninstalled_crd_reads_as_empty_and_is_looked_for_again(apiserver: FakeApiServer, follow) -> None:
    f = follow(ResourceRef("example.invalid", "v1", "widgets", namespace="default"))
    await f.until(lambda: f.lists() >= 2)
    assert f.cache.objects == {}


async def test_wrong_token_is_retried_with_backoff_not_crashed(apiserver: FakeApiServer, follow) -> None:
    apiserver.token = "rotated"
    f = follow()
    await f.until(lambda: apiserver.rejected >= 2)
    apiserver.token = "fake-token"
    apiserver.apply(pod("x", ip="127.10.0.6"))
    await f.until(lambda: f.names() == {"x"})


async def test_cancel_returns_promptly_while_a_read_is_blocked(apiserver: FakeApiServer, rest: KubeRest) -> None:
    f = Follower(rest, PODS, WatchOptions(inactivity_timeout_s=60))
    await f.until(lambda: f.cache.listed and apiserver.open_watches() == 1)
    await asyncio.sleep(0.05)  # let the worker thread block in the socket read
    async with asyncio.timeout(5):
        await f.stop()


async def test_a_stream_ended_by_the_watch_stopping_is_not_logged_as_ended(
    apiserver: FakeApiServer, rest: KubeRest, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled while its thread reads, the watch shuts the socket under that read: the error the thread then
    sees is ours, not the server's, so no "watch stream ended" line (it came after the watch's owner had gone)."""
    caplog.set_level(logging.INFO, logger="epp.discovery")
    f = Follower(rest, PODS, WatchOptions(inactivity_timeout_s=60))
    await f.until(lambda: f.cache.listed and apiserver.open_watches() == 1)
    await asyncio.sleep(0.05)  # let the worker thread block in the socket read
    readers = {t for t in threading.enumerate() if t.name.startswith("watch-pods")}
    assert readers
    await f.stop()
    for thread in readers:  # the thread's read ends once its socket is shut
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()
    assert not [r for r in caplog.records if "watch stream ended" in r.getMessage()]


async def test_a_bookmark_moves_the_resume_point_past_compacted_history(apiserver: FakeApiServer, follow) -> None:
    f = follow()
    await f.until(lambda: f.cache.listed and apiserver.open_watches() == 1)
    for i in range(3):  # other kinds move the server's resourceVersion; the pod watch sees no event
        apiserver.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": f"l{i}"}})
    apiserver.send_bookmarks()
    await asyncio.sleep(0.5)  # let the bookmark reach the client (nothing to observe it by: bookmarks are not yielded)
    apiserver.compact()
    apiserver.drop_watches()
    apiserver.apply(pod("after", ip="127.10.0.8"))
    await f.until(lambda: f.names() == {"after"})
    assert f.lists() == 1  # resumed from the bookmark: no 410, no re-list
