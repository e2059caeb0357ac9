"""Events: written with their change, read by service or node with a cursor, pruned by age
and count, logged once committed; node state changes are events."""

from __future__ import annotations

import logging

import pytest
import trio

from ficc_core.contributors import NodeRegistry
from ficc_core.events import Event, EventKind, EventRetention, Subject, record
from ficc_core.events import repository as events

from ..contributors.test_contributors import _snapshot
from ..support.clock import FakeClock


@pytest.fixture
def config(backend_config):
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_config


def _service_event(tx, service_id: str, at: float, reason: str = "x") -> Event:
    return record(
        tx,
        at=at,
        kind=EventKind.SERVICE_STATE,
        subject=Subject.SERVICE,
        subject_id=service_id,
        service_id=service_id,
        reason=reason,
        message=f"state of {service_id}",
        details={"state": {"from": "starting", "to": "ready"}},
    )


def _node_event(tx, node_id: str, at: float) -> Event:
    return record(
        tx,
        at=at,
        kind=EventKind.NODE_STATE,
        subject=Subject.NODE,
        subject_id=node_id,
        node_id=node_id,
        reason="node_lost",
        message=f"node {node_id} lost",
    )


async def test_events_read_back_whole_newest_last_and_page_on_after_a_cursor(service):
    with trio.fail_after(10):

        def write(tx):
            written = [_service_event(tx, "svc_a", 100.0 + i, reason=f"r{i}") for i in range(5)]
            _service_event(tx, "svc_b", 200.0)
            return written

        written = await service.store.write(write)
        ids = [event.id for event in written]
        assert ids == sorted(ids) and len(set(ids)) == 5

        read = await service.store.read(lambda tx: events.for_service(tx, "svc_a", limit=100))
        assert read == written  # whole: kind, subject, details (JSON), every field
        assert read[0].details == {"state": {"from": "starting", "to": "ready"}}

        # Without a cursor: the newest `limit`, oldest first.
        newest = await service.store.read(lambda tx: events.for_service(tx, "svc_a", limit=2))
        assert [e.reason for e in newest] == ["r3", "r4"]
        # With one: the first `limit` after it.
        page = await service.store.read(
            lambda tx: events.for_service(tx, "svc_a", after=ids[0], limit=2)
        )
        assert [e.reason for e in page] == ["r1", "r2"]
        rest = await service.store.read(
            lambda tx: events.for_service(tx, "svc_a", after=ids[-1], limit=2)
        )
        assert rest == []


async def test_a_service_s_listing_includes_its_nodes_state_changes_since_it_was_created(
    service,
):
    with trio.fail_after(10):

        def write(tx):
            _node_event(tx, "gpu-1", 50.0)  # before the service: not its history
            _service_event(tx, "svc_a", 100.0)
            _node_event(tx, "gpu-1", 110.0)
            _node_event(tx, "gpu-2", 120.0)  # another node

        await service.store.write(write)
        read = await service.store.read(
            lambda tx: events.for_service(
                tx, "svc_a", node_ids=["gpu-1"], nodes_since=100.0, limit=10
            )
        )
        assert [(e.kind, e.subject_id, e.at) for e in read] == [
            (EventKind.SERVICE_STATE, "svc_a", 100.0),
            (EventKind.NODE_STATE, "gpu-1", 110.0),
        ]
        own = await service.store.read(lambda tx: events.for_node(tx, "gpu-1", limit=10))
        assert [e.at for e in own] == [50.0, 110.0]

        # Merged in ID order, the bound and the cursor hold across both.
        def more(tx):
            for at in (130.0, 140.0):
                _node_event(tx, "gpu-1", at)
                _service_event(tx, "svc_a", at + 1)

        await service.store.write(more)

        def page(after, limit):
            return lambda tx: [
                e.at
                for e in events.for_service(
                    tx, "svc_a", node_ids=["gpu-1"], nodes_since=100.0, after=after, limit=limit
                )
            ]

        assert await service.store.read(page(None, 3)) == [131.0, 140.0, 141.0]
        assert await service.store.read(page(read[0].id, 3)) == [110.0, 130.0, 131.0]


async def test_an_event_exists_and_is_logged_only_when_its_change_committed(service, caplog):
    caplog.set_level(logging.INFO, logger="ficc.events")
    with trio.fail_after(10):

        def fails(tx):
            _service_event(tx, "svc_a", 1.0, reason="rolled_back")
            raise RuntimeError("the change is refused")

        with pytest.raises(RuntimeError):
            await service.store.write(fails)
        assert await service.store.read(events.count) == 0
        assert "rolled_back" not in caplog.text

        await service.store.write(lambda tx: _service_event(tx, "svc_a", 2.0, reason="kept"))
        [line] = [r for r in caplog.records if r.name == "ficc.events"]
        assert line.levelno == logging.INFO
        assert line.getMessage() == "service.state service svc_a (kept): state of svc_a"


async def test_retention_prunes_by_age_and_keeps_each_service_s_newest(service):
    clock = FakeClock(now=10_000.0)
    retention = EventRetention(service.store, retention=1000.0, max_per_service=3, clock=clock)
    with trio.fail_after(10):

        def write(tx):
            for i in range(5):
                _service_event(tx, "svc_a", 9_500.0 + i, reason=f"a{i}")
            _service_event(tx, "svc_b", 8_000.0, reason="old")  # past the retention
            _service_event(tx, "svc_b", 9_900.0, reason="recent")
            for i in range(4):
                _node_event(tx, "gpu-1", 9_600.0 + i)

        await service.store.write(write)
        assert await retention.prune() == 1 + 2 + 1

        def reasons(service_id):
            return lambda tx: [e.reason for e in events.for_service(tx, service_id, limit=10)]

        assert await service.store.read(reasons("svc_a")) == ["a2", "a3", "a4"]
        assert await service.store.read(reasons("svc_b")) == ["recent"]
        nodes = await service.store.read(lambda tx: events.for_node(tx, "gpu-1", limit=10))
        assert [e.at for e in nodes] == [9_601.0, 9_602.0, 9_603.0]

        clock.now += 1000.0  # everything is older than the retention now
        assert await retention.prune() == 7
        assert await service.store.read(events.count) == 0
        # A pruned ID is never given again: a cursor never skips a new event.
        new = await service.store.write(lambda tx: _service_event(tx, "svc_a", clock.now))
        assert new.id > max(e.id for e in nodes)


async def test_retention_runs_on_its_period_off_the_request_path(service):
    clock = FakeClock(now=10_000.0)
    retention = EventRetention(
        service.store, retention=100.0, max_per_service=10, period=0.01, clock=clock
    )
    await service.store.write(lambda tx: _service_event(tx, "svc_a", 9_990.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(retention.run)
        assert await service.store.read(events.count) == 1  # not old yet
        clock.now += 200.0
        with trio.fail_after(10):
            while await service.store.read(events.count):  # noqa: ASYNC110
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_node_state_changes_are_events_with_their_reasons(service):
    clock = FakeClock(now=1000.0)
    nodes = NodeRegistry(service.store, unreachable_after=10, lost_after=30, clock=clock)
    with trio.fail_after(10):
        await nodes.add_node("gpu-1")
        connection = await nodes.connect("gpu-1")
        await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"))
        await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"))  # no change: no event
        clock.now += 10
        await nodes.sweep()
        clock.now += 20
        await nodes.sweep()
        clock.now += 5
        connection = await nodes.connect("gpu-1")
        await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"))
        await nodes.revoke_node("gpu-1")

        found = await service.store.read(lambda tx: events.for_node(tx, "gpu-1", limit=10))
        moves = [(e.details["state"]["from"], e.details["state"]["to"], e.reason) for e in found]
        assert moves == [
            ("registered", "connected", "heartbeat"),
            ("connected", "unreachable", "no_heartbeat"),
            ("unreachable", "lost", "node_lost"),
            ("lost", "connected", "heartbeat"),
            ("connected", "revoked", "revoked"),
        ]
        assert all(e.kind == EventKind.NODE_STATE and e.subject == Subject.NODE for e in found)
        assert found[1].message == (
            "node gpu-1: connected → unreachable: no heartbeat for 10 s; no new work goes there"
        )
        assert (
            found[3].message == "node gpu-1: lost → connected: its heartbeats arrive again "
            "(no heartbeat for 35 s)"
        )


async def test_a_failing_after_commit_callback_leaves_the_committed_change_standing(
    service, caplog
):
    def write(tx):
        event = _service_event(tx, "svc_a", 1.0)

        def broken() -> None:
            raise RuntimeError("a broken log handler")

        tx.after_commit(broken)
        return event

    with trio.fail_after(10):
        event = await service.store.write(write)
    assert await service.store.read(events.count) == 1 and event.id > 0
    assert "a callback after a committed transaction failed" in caplog.text
