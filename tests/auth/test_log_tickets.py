"""Stream tickets: single use, 60 s, bound to the stream and the caller, hashed at rest."""

from __future__ import annotations

import time

import pytest
import trio

from ficc_core.auth.tickets import TICKET_LIFETIME, TicketRefused, Tickets

from ..conftest import issue_token
from ..support.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time())


@pytest.fixture
def tickets(service, clock) -> Tickets:
    return Tickets(service.store, clock=clock)


async def _principal(service, **kwargs):
    token = await issue_token(service, **kwargs)
    return await service.auth.authenticate_bearer(token)


async def _refused(tickets: Tickets, ticket: str, subject: str = "svc/0") -> str:
    with pytest.raises(TicketRefused) as refused:
        await tickets.redeem(ticket, "logs", subject)
    assert refused.value.status == 401
    assert refused.value.code == "ticket_invalid"
    return refused.value.details["reason"]


async def test_a_ticket_opens_its_stream_once_as_its_caller(service, bootstrap, tickets, clock):
    principal = await _principal(service)
    ticket, expires_at = await tickets.mint(principal, "logs", "svc/0")
    assert expires_at == clock.now + TICKET_LIFETIME == clock.now + 60
    redeemed = await tickets.redeem(ticket, "logs", "svc/0")
    assert (redeemed.principal_id, redeemed.project_id) == (principal.id, principal.project_id)
    assert redeemed.principal().id == principal.id
    assert await _refused(tickets, ticket) == "used"


async def test_only_the_hash_of_a_ticket_is_stored(service, bootstrap, tickets):
    ticket, _ = await tickets.mint(await _principal(service), "logs", "svc/0")
    rows = await service.store.read(lambda tx: tx.fetch_all("SELECT * FROM stream_tickets"))
    assert len(rows) == 1
    assert all(ticket not in str(value) for value in rows[0].values())
    assert all(ticket[4:] not in str(value) for value in rows[0].values())


async def test_two_redemptions_at_once_let_exactly_one_through(service, bootstrap, tickets):
    ticket, _ = await tickets.mint(await _principal(service), "logs", "svc/0")
    outcomes: list[str] = []

    async def redeem() -> None:
        try:
            await tickets.redeem(ticket, "logs", "svc/0")
            outcomes.append("ok")
        except TicketRefused as refused:
            outcomes.append(refused.details["reason"])

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(redeem)
    assert sorted(outcomes) == ["ok"] + ["used"] * 7


async def test_a_ticket_expires_after_sixty_seconds(service, bootstrap, tickets, clock):
    principal = await _principal(service)
    early, _ = await tickets.mint(principal, "logs", "svc/0")
    late, _ = await tickets.mint(principal, "logs", "svc/0")
    clock.now += 59.9
    await tickets.redeem(early, "logs", "svc/0")
    clock.now += 0.1
    assert await _refused(tickets, late) == "expired"


async def test_a_ticket_is_bound_to_its_stream(service, bootstrap, tickets):
    ticket, _ = await tickets.mint(await _principal(service), "logs", "svc/0")
    assert await _refused(tickets, ticket, "svc/1") == "another_stream"
    assert await _refused(tickets, ticket, "other/0") == "another_stream"
    with pytest.raises(TicketRefused):
        await tickets.redeem(ticket, "events", "svc/0")
    # A refusal for another stream does not spend it.
    await tickets.redeem(ticket, "logs", "svc/0")


async def test_unknown_and_missing_tickets_are_refused(service, bootstrap, tickets):
    assert await _refused(tickets, "") == "missing"
    assert await _refused(tickets, "ftk_not-a-ticket") == "unknown"
    assert await _refused(tickets, "ficc_a_bearer_token") == "unknown"


async def test_revoking_the_caller_invalidates_its_tickets(service, bootstrap, tickets):
    principal = await _principal(service)
    other = await _principal(service, name="other")
    revoked, _ = await tickets.mint(principal, "logs", "svc/0")
    kept, _ = await tickets.mint(other, "logs", "svc/0")
    await service.auth.revoke_credential(None, principal.id)
    assert await _refused(tickets, revoked) == "caller_invalid"
    await tickets.redeem(kept, "logs", "svc/0")


async def test_a_ticket_lives_no_longer_than_its_caller(service, bootstrap, tickets, clock):
    _, token = await service.auth.create_credential(
        "default", name="short", scopes=frozenset({"inference:read"}), lifetime=30
    )
    principal = await service.auth.authenticate_bearer(token)
    ticket, _ = await tickets.mint(principal, "logs", "svc/0")
    clock.now = principal.expires_at + 1  # still inside the ticket's own 60 s
    assert await _refused(tickets, ticket) == "caller_invalid"


async def test_a_logged_out_session_invalidates_its_tickets(service, bootstrap, tickets):
    principal, _cookie, _csrf = await service.auth.login("admin", bootstrap["password"], "default")
    spent, _ = await tickets.mint(principal, "logs", "svc/0")
    await tickets.redeem(spent, "logs", "svc/0")
    ticket, _ = await tickets.mint(principal, "logs", "svc/0")
    await service.auth.logout(principal.id)
    assert await _refused(tickets, ticket) == "caller_invalid"
