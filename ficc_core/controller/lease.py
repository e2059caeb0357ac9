"""The leader lease: which of the controllers sharing one store places work, fenced by a term.

One row of the store (``controller_leader``) names the holder, the URL it is reached
on, its *term* and when its claim runs out. Every controller runs a
:class:`LeaderLease`: in one write transaction it takes the row when there is none or
it ran out (with the term one higher than the last), renews it while the row still
names it with its term, and otherwise reads who leads. The term travels on every
command to a node (:mod:`ficc_core.nodelink`), and a node refuses a lower one than it
has seen, so a deposed leader that has not noticed yet can no longer launch or stop.

Expiry is judged with the writing controller's wall clock (``time.time``): every
controller writes and compares the same column with its own clock, which holds as
long as their clocks agree to well within ``leader_lease`` (NTP does, by orders of
magnitude). The holder does not trust the store's column for itself: it counts its
lease from the monotonic time *before* the write that granted it, so it always
believes its lease ends no later than the others do, and it steps down at that
moment even if the store stopped answering (a renewal still in flight cannot hold it
up). A clean shutdown releases the row (its expiry set to now), so a standby takes
over at its next try instead of after the lease.

Claims never queue behind ordinary writes (:meth:`~ficc_core.store.Store.lease_write`:
on PostgreSQL a lock of their own, every wait bounded within the renew interval), so a
controller frozen or lost in the middle of a write cannot keep a standby from taking
over once its lease ran out: the takeover stays within ``leader_lease`` +
``leader_renew_interval``.

What runs in each role is the caller's (:func:`~ficc_core.controller.service.open_service`):
``lead(term)`` while this controller holds the lease, ``follow()`` while it does not.
Exactly one of them runs at a time; a change of role cancels the one running and waits
for it to end before the other starts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import trio

from ..base.errors import FiccError, NotLeader
from . import lease_repository as repository
from .lease_records import ControllerRow, LeaderRow, Role

if TYPE_CHECKING:
    from ..store import Store, Transaction

log = logging.getLogger("ficc.controller")


def claim(
    tx: Transaction,
    me: str,
    url: str,
    held: int | None,
    now: float,
    duration: float,
    started_at: float,
) -> tuple[LeaderRow, bool]:
    """Take or renew the lease for ``me`` in this transaction; return the row after and
    whether ``me`` holds it now.

    ``held`` is the term ``me`` holds (None when it holds none). The row is renewed
    only while it names ``me`` with that term and has not run out; it is taken (term
    one higher) when there is none or it ran out; otherwise it is left as it is
    (another controller leads, or a previous run of ``me`` whose claim still stands:
    it is not resumed, so two processes given one name never share a term). Also
    records ``me`` as seen.
    """
    row = repository.read_leader(tx)
    # Each write is conditional on the row it read and counted (see lease_repository),
    # so two claimants can never both take one term.
    holds = False
    until = now + duration
    if row is not None and row.holder == me and row.term == held and row.expires_at > now:
        holds = repository.renew(tx, me, url, held, now, until)
        if holds:
            row = attrs.evolve(row, expires_at=until, url=url)
    elif row is None:
        holds = repository.take_first(tx, me, url, now, until)
        if holds:
            row = LeaderRow(me, url, 1, now, until)
    elif row.expires_at <= now:
        holds = repository.take_over(tx, me, url, row.term + 1, now, until, row.term)
        if holds:
            row = LeaderRow(me, url, row.term + 1, now, until)
    if not holds:
        row = repository.read_leader(tx) or row
    assert row is not None  # a claim that lost a race read the winner's row
    repository.seen(tx, me, url, Role.LEADER if holds else Role.STANDBY, row.term, started_at, now)
    return row, holds


def release(
    tx: Transaction, me: str, url: str, held: int | None, now: float, started_at: float
) -> None:
    """Give the lease up (its expiry becomes now) if ``me`` holds it at ``held``; record
    ``me`` as stopped."""
    if held is not None:
        repository.expire(tx, me, held, now)
    row = repository.read_leader(tx)
    repository.seen(tx, me, url, Role.STOPPED, 0 if row is None else row.term, started_at, now)


#: What a leader runs, for its term, until cancelled: ``lead(term, task_status=...)``,
#: reporting ``task_status.started()`` once its work runs.
Lead = Callable[..., Awaitable[None]]
#: What a standby runs until cancelled: ``follow(task_status=...)``, likewise.
Follow = Callable[..., Awaitable[None]]


async def _nothing(
    *_args: object, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started()
    await trio.sleep_forever()


class LeaderLease:
    """This controller's side of the leader lease; run it with ``await nursery.start(lease.run)``.

    :param controller_id: this controller's name in the leader row.
    :param url: the URL others reach it on (:meth:`advertise` may set it once bound).
    :param duration: how long a claim stands without renewal (``leader_lease``).
    :param renew_interval: how often the leader renews and a standby tries to take over.
    :param lead: what runs while this controller leads (given its term), until cancelled.
    :param follow: what runs while it is a standby, until cancelled.
    :param clock: wall-clock seconds, the store's time (tests pass their own).
    """

    def __init__(
        self,
        store: Store,
        *,
        controller_id: str,
        url: str,
        duration: float,
        renew_interval: float,
        lead: Lead = _nothing,
        follow: Follow = _nothing,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.url = url
        self.duration = duration
        self.renew_interval = renew_interval
        self.lead = lead
        self.follow = follow
        self.clock = clock
        #: The leader row as last read or written (None before the first, or when unknown).
        self.leader: LeaderRow | None = None
        self._held: int | None = None
        #: The trio time the held lease ends at (counted from before the write granting it).
        self._deadline = -math.inf
        self._started_at = clock()
        self._changed = trio.Event()
        self._role_scope: trio.CancelScope | None = None
        #: The leader this standby last said it follows.
        self._announced: tuple[str, int] | None = None
        #: The operations running :meth:`while_leading` now.
        self._operations: set[trio.CancelScope] = set()
        #: The term held when this controller stepped down because its lease went
        #: unrenewed (the store did not answer), until the store names another leader.
        self._unconfirmed: int | None = None
        #: One claim at a time: a claim reads the term held before it writes.
        self._claiming = trio.Lock()
        #: Whether :meth:`run` made its first claim (so :meth:`advertise` claims at once).
        self._running = False
        #: Set by :meth:`stop_work`: the role's work does not start again.
        self._stopping = False
        #: Set once the role's work ended for good (None unless :meth:`run` runs it).
        self._work_ended: trio.Event | None = None

    # -- what the rest of the controller asks ---------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this controller holds the lease now."""
        return self._held is not None

    @property
    def renewing(self) -> bool:
        """Whether this controller renews its nodes' attempt leases: while it leads, and
        after it stepped down only because the store stopped answering, at the term it
        held, until the store names another leader or a newer term (its own next claim).

        While the database is down nobody can take the lease, and the nodes' engines
        must not die of the outage (their leases outlast a short one, not a long one).
        A renewal at the old term is harmless where another controller did take over
        (a partition): the nodes refuse it once they saw the newer term, and launches
        and stops, the commands that change what runs, are never sent without the lease.
        """
        return self._held is not None or self._unconfirmed is not None

    @property
    def role(self) -> Role:
        """This controller's role now."""
        return Role.LEADER if self.leading else Role.STANDBY

    @property
    def term(self) -> int:
        """The term this controller holds, else the newest it has seen (0 before any)."""
        if self._held is not None:
            return self._held
        return 0 if self.leader is None else self.leader.term

    def known_leader(self) -> LeaderRow | None:
        """The leader as last read, unless its lease ran out since (then None)."""
        row = self.leader
        if row is None or row.expires_at <= self.clock():
            return None
        return row

    def require_leader(self, action: str) -> None:
        """Return on the leader; raise :class:`~ficc_core.base.errors.NotLeader` on a standby."""
        if self.leading:
            return
        row = self.known_leader()
        raise NotLeader(
            action,
            leader_id=None if row is None else row.holder,
            leader_url=None if row is None else row.url,
            term=self.term,
            retry_after=max(1, math.ceil(self.renew_interval)),
        )

    @asynccontextmanager
    async def while_leading(self, action: str) -> AsyncIterator[None]:
        """Run an operation that needs the leader (a move, a restart) only while it leads.

        Refused at once on a standby; cancelled if the lease is lost while it runs (its
        shielded steps, a launch, complete first), which then raises ``not_leader``: the
        new leader's reconciler finds what it left as a restarted controller would.
        """
        self.require_leader(action)
        with trio.CancelScope() as scope:
            self._operations.add(scope)
            try:
                yield
            finally:
                self._operations.discard(scope)
        if scope.cancelled_caught:
            self.require_leader(action)

    async def stop_work(self) -> None:
        """End the role's work for good, as losing the lease would (nothing it runs is
        stopped), and return once it ended: the controller is stopping. The lease itself
        stays held until :meth:`run` is cancelled, which releases it."""
        self._stopping = True
        if self._role_scope is not None:
            self._role_scope.cancel()
        if self._work_ended is not None:
            await self._work_ended.wait()

    def describe(self) -> str:
        """``leader (term N)`` or ``standby; leader is X at URL (term N)``, as logged."""
        if self.leading:
            return f"leader (term {self.term})"
        row = self.known_leader()
        if row is None:
            return f"standby; no leader holds the lease now (term {self.term})"
        return f"standby; leader is {row.holder} at {row.url} (term {row.term})"

    async def advertise(self, url: str) -> None:
        """Name ``url`` (the listener's, once it bound a port) in the store now.

        While :meth:`run` runs, this claims once at once, so the leader row and this
        controller's row name the URL from here on, not from the next renewal (until
        then another controller and ``ficc status`` would see the unbound one);
        before it, the first claim carries it.
        """
        self.url = url
        if self._running:
            await self.tick()

    async def status(self) -> tuple[LeaderRow | None, list[ControllerRow]]:
        """The leader row and every controller seen, read from the store now."""

        def read(tx: Transaction) -> tuple[LeaderRow | None, list[ControllerRow]]:
            return repository.read_leader(tx), repository.read_controllers(tx)

        return await self.store.read(read)

    @property
    def _claim_bound(self) -> float:
        """The longest one claim may wait on the store: within the renew interval, so a
        claim that cannot be made (a hung database) is over before the next one is due."""
        return max(0.5, self.renew_interval * 0.8)

    # -- running ----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim the lease once, start the role's work (reported started once it runs),
        then keep claiming until cancelled.

        On cancellation the lease is released (when held) and this controller recorded
        as stopped.
        """
        try:
            async with trio.open_nursery() as nursery:
                await self.tick()
                self._running = True
                nursery.start_soon(self._watch_expiry)
                await nursery.start(self._run_roles)
                task_status.started()
                while True:
                    await trio.sleep(self.renew_interval)
                    await self.tick()
        finally:
            self._running = False
            with trio.CancelScope(shield=True), trio.move_on_after(max(1.0, self.renew_interval)):
                await self._release()

    async def tick(self) -> None:
        """One claim: renew or take the lease, or learn who holds it (store errors are
        logged; the expiry watch steps a leader down when its lease ran out)."""
        async with self._claiming:
            await self._claim()

    async def _claim(self) -> None:
        began = trio.current_time()
        held = self._held
        now = self.clock()
        try:
            row, holds = await self.store.lease_write(
                lambda tx: claim(
                    tx,
                    self.controller_id,
                    self.url,
                    held,
                    now,
                    self.duration,
                    self._started_at,
                ),
                self._claim_bound,
            )
        except FiccError as exc:
            log.warning("cannot reach the store to claim the leader lease: %s", exc.message)
            return
        except Exception:
            log.exception("cannot claim the leader lease")
            return
        self.leader = row
        if self._unconfirmed is not None and (
            row.holder != self.controller_id or row.term != self._unconfirmed
        ):
            self._unconfirmed = None  # another controller (or a newer term) leads now
        if held is not None and self._held != held:
            return  # it stepped down while the write was in flight: that claim is void
        if holds:
            self._deadline = began + self.duration
            if held is None:
                self._set(row.term, f"leader (term {row.term})")
            return
        if held is not None:
            self._set(None, f"standby; leader is {row.holder} at {row.url} (term {row.term})")
        elif self._announced != (row.holder, row.term):
            log.info("standby; leader is %s at %s (term %d)", row.holder, row.url, row.term)
        self._announced = (row.holder, row.term)

    async def _release(self) -> None:
        async with self._claiming:  # not beside a claim of :meth:`advertise`'s
            await self._give_up()

    async def _give_up(self) -> None:
        held, self._held = self._held, None
        self._unconfirmed = None
        now = self.clock()
        try:
            await self.store.lease_write(
                lambda tx: release(tx, self.controller_id, self.url, held, now, self._started_at),
                self._claim_bound,
            )
        except Exception as exc:  # shutting down: the lease runs out by itself then
            log.warning("could not release the leader lease: %s", exc)
            return
        if held is not None:
            log.info("released the leader lease (term %d)", held)

    def _set(self, held: int | None, message: str) -> None:
        self._held = held
        log.info("%s", message)
        self._changed.set()
        self._changed = trio.Event()
        if self._role_scope is not None:
            self._role_scope.cancel()
        if held is None:
            for operation in list(self._operations):
                operation.cancel()

    async def _watch_expiry(self) -> None:
        """Step down the moment the held lease runs out unrenewed (whatever the store does)."""
        while True:
            if self._held is None:
                await self._changed.wait()
                continue
            if trio.current_time() >= self._deadline:
                self._unconfirmed = self._held
                self._set(
                    None,
                    f"stepping down: the lease (term {self._held}) was not renewed within "
                    f"{self.duration:g} s",
                )
                continue
            await trio.sleep_until(self._deadline)

    async def _run_roles(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run ``lead`` or ``follow`` for the role now; switch when the role changes.

        Work that fails (its first read met a store that went down, say) is logged and
        started again after ``renew_interval``, in whatever role this controller has
        then: a controller keeps serving through it.
        """
        reported = False
        ended = self._work_ended = trio.Event()
        try:
            while not self._stopping:
                held = self._held
                failed = False
                with trio.CancelScope() as scope:
                    self._role_scope = scope
                    try:
                        async with trio.open_nursery() as work:
                            if held is not None:
                                await work.start(self.lead, held)
                            else:
                                await work.start(self.follow)
                            if not reported:
                                reported = True
                                task_status.started()
                            await trio.sleep_forever()  # until the role changes
                    except Exception:
                        role = "leader" if held is not None else "standby"
                        log.exception(
                            "the %s's work failed; starting it again in %g s",
                            role,
                            self.renew_interval,
                        )
                        failed = True
                self._role_scope = None
                if failed and not self._stopping:
                    await trio.sleep(self.renew_interval)
            if not reported:
                task_status.started()
            ended.set()
            await trio.sleep_forever()  # stopped for good: until the lease is released
        finally:
            ended.set()


__all__ = ["LeaderLease", "claim", "release"]
