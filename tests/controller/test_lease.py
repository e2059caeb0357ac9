"""The leader lease on a real SQLite store: acquire, renew, expiry, step-down, release, terms.

Times in the store come from an injected wall clock the tests move; the holder's own
deadline is trio's clock, so a stalled store is a real stall of the write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from ficc_core.base.errors import NotLeader
from ficc_core.controller.lease import LeaderLease, claim
from ficc_core.controller.lease_records import Role
from ficc_core.controller.lease_repository import read_controllers, read_leader
from ficc_core.store import SQLiteStore, open_sqlite_store

from ..support.clock import FakeClock
from ..support.waiting import eventually


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = await open_sqlite_store(tmp_path / "ficc.sqlite3")
    try:
        yield opened
    finally:
        await opened.aclose()


class StallingStore:
    """The real store, whose writes can be made to hang (a database that stopped answering)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.stalled: trio.Event | None = None

    async def read(self, fn: Callable[[Any], Any]) -> Any:
        return await self.store.read(fn)

    async def write(self, fn: Callable[[Any], Any]) -> Any:
        if self.stalled is not None:
            await self.stalled.wait()
        return await self.store.write(fn)

    async def lease_write(self, fn: Callable[[Any], Any], bound: float) -> Any:
        return await self.write(fn)


def lease_of(store: Any, name: str, clock: FakeClock, **kwargs: Any) -> LeaderLease:
    return LeaderLease(
        store,
        controller_id=name,
        url=f"http://{name}.example:8484",
        duration=kwargs.pop("duration", 1.5),
        renew_interval=kwargs.pop("renew_interval", 0.3),
        clock=clock,
        **kwargs,
    )


async def test_the_first_claim_takes_term_one(store: SQLiteStore) -> None:
    row, holds = await store.write(lambda tx: claim(tx, "a", "http://a", None, 100.0, 15.0, 99.0))
    assert holds and (row.holder, row.term, row.expires_at) == ("a", 1, 115.0)
    [seen] = await store.read(read_controllers)
    assert (seen.id, seen.role, seen.term) == ("a", "leader", 1)


async def test_a_held_lease_is_renewed_with_its_term_and_refused_to_another(
    store: SQLiteStore,
) -> None:
    await store.write(lambda tx: claim(tx, "a", "http://a", None, 100.0, 15.0, 99.0))
    row, holds = await store.write(lambda tx: claim(tx, "a", "http://a", 1, 105.0, 15.0, 99.0))
    assert holds and (row.term, row.expires_at) == (1, 120.0)
    row, holds = await store.write(lambda tx: claim(tx, "b", "http://b", None, 119.0, 15.0, 99.0))
    assert not holds and row.holder == "a"
    roles = {c.id: c.role for c in await store.read(read_controllers)}
    assert roles == {"a": "leader", "b": "standby"}


async def test_an_expired_lease_goes_to_the_next_claimant_with_a_higher_term(
    store: SQLiteStore,
) -> None:
    await store.write(lambda tx: claim(tx, "a", "http://a", None, 100.0, 15.0, 99.0))
    row, holds = await store.write(lambda tx: claim(tx, "b", "http://b", None, 115.0, 15.0, 99.0))
    assert holds and (row.holder, row.term) == ("b", 2)
    # The deposed holder's renewal finds the row no longer names it with its term.
    row, holds = await store.write(lambda tx: claim(tx, "a", "http://a", 1, 116.0, 15.0, 99.0))
    assert not holds and (row.holder, row.term) == ("b", 2)


async def test_a_previous_run_of_the_same_name_is_not_resumed(store: SQLiteStore) -> None:
    """A restarted controller (or a second one given the same name) waits for the old
    claim to run out, then takes a new term: two processes never share one."""
    await store.write(lambda tx: claim(tx, "a", "http://a", None, 100.0, 15.0, 99.0))
    row, holds = await store.write(lambda tx: claim(tx, "a", "http://a", None, 101.0, 15.0, 101.0))
    assert not holds and row.term == 1
    row, holds = await store.write(lambda tx: claim(tx, "a", "http://a", None, 115.0, 15.0, 101.0))
    assert holds and row.term == 2


async def test_one_of_two_leases_leads_and_the_other_names_it(store: SQLiteStore) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    a, b = lease_of(store, "a", clock), lease_of(store, "b", clock)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            assert a.leading and a.term == 1 and a.role == Role.LEADER
            assert not b.leading and b.term == 1
            with pytest.raises(NotLeader) as refused:
                b.require_leader("move")
            assert refused.value.status == 409
            assert refused.value.details["leader"] == {"id": "a", "url": "http://a.example:8484"}
            assert refused.value.details["term"] == 1
            a.require_leader("move")
            nursery.cancel_scope.cancel()


async def test_the_leader_renews_while_it_runs(store: SQLiteStore) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    a = lease_of(store, "a", clock)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            first = (await store.read(read_leader)).expires_at
            while (await store.read(read_leader)).expires_at == first:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert a.leading and a.term == 1
            nursery.cancel_scope.cancel()


async def test_an_advertised_url_is_in_the_store_at_once_not_at_the_next_renewal(
    store: SQLiteStore,
) -> None:
    """The listener binds after the first claim (port 0): the URL it got must reach the
    leader row and the controllers' rows before ``serve_http`` reports started."""
    clock = FakeClock(1_000_000.0, follow_trio=True)
    a, b = (lease_of(store, name, clock, renew_interval=3600.0) for name in ("a", "b"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            assert (await store.read(read_leader)).url == "http://a.example:8484"
            await a.advertise("http://127.0.0.1:40001")
            await b.advertise("http://127.0.0.1:40002")
            row = await store.read(read_leader)
            assert (row.holder, row.url, row.term) == ("a", "http://127.0.0.1:40001", 1)
            urls = {c.id: (c.url, c.role) for c in await store.read(read_controllers)}
            assert urls == {
                "a": ("http://127.0.0.1:40001", "leader"),
                "b": ("http://127.0.0.1:40002", "standby"),
            }
            assert a.leading and not b.leading and a.term == b.term == 1
            nursery.cancel_scope.cancel()


async def test_an_url_advertised_before_the_lease_runs_goes_with_its_first_claim(
    store: SQLiteStore,
) -> None:
    a = lease_of(store, "a", FakeClock(1_000_000.0, follow_trio=True), renew_interval=3600.0)
    await a.advertise("http://127.0.0.1:40003")
    assert await store.read(read_leader) is None  # nothing claimed before run
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            assert (await store.read(read_leader)).url == "http://127.0.0.1:40003"
            nursery.cancel_scope.cancel()


async def test_a_leader_whose_store_stalls_steps_down_when_its_lease_runs_out(
    store: SQLiteStore,
) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    stalling = StallingStore(store)
    led = trio.Event()
    ended = trio.Event()

    async def lead(term: int, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        led.set()
        try:
            await trio.sleep_forever()
        finally:
            ended.set()

    a = lease_of(stalling, "a", clock, lead=lead)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await led.wait()
            stalling.stalled = trio.Event()
            began = trio.current_time()
            await ended.wait()
            # It stopped leading within its lease of the last renewal, though no write came back.
            assert trio.current_time() - began <= a.duration + 0.2
            assert not a.leading
            stalling.stalled.set()
            nursery.cancel_scope.cancel()


async def test_a_standby_takes_over_within_lease_and_renewal_when_the_leader_stops_renewing(
    store: SQLiteStore,
) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    stalling = StallingStore(store)
    b_led = trio.Event()

    async def b_lead(term: int, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        b_led.set()
        await trio.sleep_forever()

    a = lease_of(stalling, "a", clock)
    b = lease_of(store, "b", clock, lead=b_lead)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            stalling.stalled = trio.Event()  # the leader can no longer write
            began = trio.current_time()
            await b_led.wait()
            assert trio.current_time() - began <= b.duration + b.renew_interval + 0.3
            assert b.term == 2 and b.leading and not a.leading
            stalling.stalled.set()
            # The old leader's next claim finds the row taken: it stays a standby.
            await a.tick()
            assert not a.leading and a.leader.holder == "b"
            nursery.cancel_scope.cancel()


async def test_a_clean_shutdown_releases_the_lease_for_a_standby_at_once(
    store: SQLiteStore,
) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    a, b = lease_of(store, "a", clock), lease_of(store, "b", clock)
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as nursery:
                await nursery.start(a.run)
                await outer.start(b.run)
                assert a.leading and not b.leading
                nursery.cancel_scope.cancel()
            # No wait for the lease: the next claim takes it.
            await b.tick()
            assert b.leading and b.term == 2
            roles = {c.id: c.role for c in await store.read(read_controllers)}
            assert roles["a"] == "stopped"
            outer.cancel_scope.cancel()


async def test_terms_strictly_increase_across_restarts(store: SQLiteStore) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    terms = []
    with trio.fail_after(10):
        for _ in range(3):
            lease = lease_of(store, "a", clock)
            async with trio.open_nursery() as nursery:
                await nursery.start(lease.run)
                terms.append(lease.term)
                nursery.cancel_scope.cancel()
    assert terms == [1, 2, 3]


async def test_no_known_leader_is_a_503_with_retry_after(store: SQLiteStore) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    b = lease_of(store, "b", clock)
    with pytest.raises(NotLeader) as refused:
        b.require_leader("restart")
    assert refused.value.status == 503
    assert refused.value.headers["Retry-After"] == "1"
    assert refused.value.details["leader"] is None


async def test_role_work_switches_with_the_role(store: SQLiteStore) -> None:
    """Losing the lease cancels the leader's work and starts the standby's; never both."""
    clock = FakeClock(1_000_000.0, follow_trio=True)
    running: list[str] = []
    log: list[str] = []

    def work(name: str) -> Callable[..., Any]:
        async def run(*_args: Any, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            assert not running, "two roles' work ran at once"
            running.append(name)
            log.append(name)
            try:
                await trio.sleep_forever()
            finally:
                running.remove(name)

        return run

    a = lease_of(store, "a", clock, lead=work("lead"), follow=work("follow"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await eventually(lambda: log == ["lead"], None, every=0.01)
            # Another controller took the row meanwhile (our lease was judged expired).
            clock.now += 100
            now = clock()
            await store.write(lambda tx: claim(tx, "b", "http://b", None, now, 60.0, 0.0))
            await eventually(lambda: log == ["lead", "follow"], None, every=0.01)
            assert not a.leading and a.leader.holder == "b"
            nursery.cancel_scope.cancel()


async def test_leader_work_that_fails_is_started_again(store: SQLiteStore, caplog) -> None:
    """A defect or a store error in the leader's work does not end the controller."""
    clock = FakeClock(1_000_000.0, follow_trio=True)
    starts: list[int] = []
    running = trio.Event()

    async def lead(term: int, task_status: trio.TaskStatus[None]) -> None:
        starts.append(term)
        if len(starts) == 1:
            raise RuntimeError("the store went away under the reconciler's first read")
        task_status.started()
        running.set()
        await trio.sleep_forever()

    a = lease_of(store, "a", clock, lead=lead)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await running.wait()
            assert starts == [1, 1] and a.leading
            assert "the leader's work failed" in caplog.text
            nursery.cancel_scope.cancel()


async def test_an_operation_needing_the_leader_ends_when_the_lease_is_lost(
    store: SQLiteStore,
) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    a = lease_of(store, "a", clock)
    entered = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)

            async def operation() -> None:
                with pytest.raises(NotLeader) as refused:
                    async with a.while_leading("move"):
                        entered.set()
                        await trio.sleep_forever()  # a move waiting for its target
                assert refused.value.details["leader"]["id"] == "b"

            async with trio.open_nursery() as operations:
                operations.start_soon(operation)
                await entered.wait()
                clock.now += 100  # the lease ran out in the store; b took it
                now = clock()
                await store.write(lambda tx: claim(tx, "b", "http://b", None, now, 60.0, 0.0))
                await a.tick()
            assert not a.leading
            nursery.cancel_scope.cancel()


async def test_a_leader_the_store_stopped_answering_keeps_renewing_its_nodes_until_it_hears(
    store: SQLiteStore,
) -> None:
    """Stepped down because the store did not answer, it leads no more (no launch, no
    stop, no reconciler) but keeps its nodes' engines alive at its old term, until the
    store names another leader or a newer term (here its own next claim)."""
    clock = FakeClock(1_000_000.0, follow_trio=True)
    stalling = StallingStore(store)
    a = lease_of(stalling, "a", clock)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            assert a.leading and a.renewing
            held = a.term
            stalling.stalled = trio.Event()
            await eventually(lambda: not a.leading, None, every=0.05)
            assert a.renewing and a.term == held  # nobody can have taken it meanwhile
            with pytest.raises(NotLeader):
                a.require_leader("move")
            stalling.stalled.set()  # the store answers; the old claim runs out unresumed
            while not a.leading:
                assert a.renewing  # the nodes are renewed all along
                await trio.sleep(0.02)
            assert a.term == held + 1
            nursery.cancel_scope.cancel()


async def test_a_standby_never_renews(store: SQLiteStore) -> None:
    clock = FakeClock(1_000_000.0, follow_trio=True)
    a, b = lease_of(store, "a", clock), lease_of(store, "b", clock)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            assert a.renewing and not b.renewing and not b.leading
            nursery.cancel_scope.cancel()
