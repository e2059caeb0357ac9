"""Credential checks without the store: rejected tokens remembered, a store outage is 503.

Over the real app and SQLite store; the store is wrapped only to count its reads or to
make them fail or hang (the edge a database outage is).
"""

from __future__ import annotations

import sqlite3
import time

import pytest
import trio

from ficc_core.auth import PROJECT_SCOPES, AuthService
from ficc_core.base.errors import StoreUnavailable, Unauthenticated

from ..conftest import bearer, issue_token
from ..support.clock import FakeClock
from ..support.waiting import eventually


@pytest.fixture
def config(backend_config):
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_config


class FlakyStore:
    """The real store, counting reads; ``fail`` makes reads raise, ``hold`` makes them wait."""

    def __init__(self, store) -> None:
        self.store, self.reads = store, 0
        self.fail = False
        self.hold: trio.Event | None = None

    async def read(self, fn):
        self.reads += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            raise sqlite3.OperationalError("disk I/O error")
        return await self.store.read(fn)

    async def write(self, fn):
        return await self.store.write(fn)


def _wrong(token: str) -> str:
    return token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")


async def test_a_client_looping_with_a_bad_key_costs_one_store_read(client, service, bootstrap):
    counting = FlakyStore(service.store)
    service.auth.authority.store = counting
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="looped")
    wrong = _wrong(token)
    unknown = "ficc_" + "x" * 22 + "." + "y" * 43
    for bad in (wrong, unknown):
        before = counting.reads
        for _ in range(20):
            response = await client.get("/api/v1/whoami", headers=bearer(bad))
            assert response.status_code == 401
            assert (await response.get_json())["error"]["code"] == "invalid_credential"
        assert counting.reads == before + 1, "only the first check reads the store"
    # The right secret for the same id is not blocked by the wrong one's rejection.
    assert (await client.get("/api/v1/whoami", headers=bearer(token))).status_code == 200


async def test_a_rejection_is_remembered_for_the_negative_ttl_and_revocations_stay(
    service, bootstrap
):
    clock = FakeClock()
    counting = FlakyStore(service.store)
    auth = AuthService(counting, clock=clock, rejected_cache_seconds=30)
    credential, token = await service.auth.create_credential(
        "default", name="ttl", scopes=frozenset({"models:read"})
    )
    wrong = _wrong(token)
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            await auth.authenticate_bearer(wrong)
    assert counting.reads == 1
    clock.now += 30  # remembered for 30 s, not longer
    with pytest.raises(Unauthenticated):
        await auth.authenticate_bearer(wrong)
    assert counting.reads == 2
    # A revocation seen in the store is remembered too: no stale entry serves it again,
    # not even while the store is down.
    assert (await auth.authenticate_bearer(token)).id == credential.id
    await service.store.write(
        lambda tx: tx.execute(
            "UPDATE credentials SET revoked_at = ? WHERE id = ?", (clock.now, credential.id)
        )
    )
    clock.now += 5
    for _ in range(2):
        with pytest.raises(Unauthenticated) as refused:
            await auth.authenticate_bearer(token)
        assert refused.value.code == "credential_revoked"
    assert counting.reads == 4, "one read for the verification, one for the revocation"
    counting.fail = True
    with pytest.raises(Unauthenticated) as refused:
        await auth.authenticate_bearer(token)
    assert refused.value.code == "credential_revoked"


async def test_a_failing_store_is_503_with_retry_after_never_401(client, service, bootstrap):
    flaky = FlakyStore(service.store)
    authority = service.auth.authority
    authority.store = flaky
    known = await issue_token(service, scopes=PROJECT_SCOPES, name="known")
    fresh = await issue_token(service, scopes=PROJECT_SCOPES, name="fresh")
    assert (await client.get("/api/v1/whoami", headers=bearer(known))).status_code == 200
    authority.cache_seconds = 1e-9  # every check now asks the store
    flaky.fail = True
    for token in (fresh, _wrong(known), fresh):
        response = await client.get("/api/v1/whoami", headers=bearer(token))
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        body = await response.get_json()
        assert body["error"]["code"] == "store_unavailable"
        assert body["error"]["details"]["retry_after"] == 1
    # A credential verified before is served from memory while the store is down.
    response = await client.get("/api/v1/whoami", headers=bearer(known))
    assert response.status_code == 200
    # Failures were not remembered as rejections: once the store is back, both work.
    flaky.fail = False
    assert (await client.get("/api/v1/whoami", headers=bearer(fresh))).status_code == 200
    assert (await client.get("/api/v1/whoami", headers=bearer(known))).status_code == 200


async def test_a_hanging_store_read_is_bounded_and_shared(service, bootstrap):
    flaky = FlakyStore(service.store)
    auth = AuthService(flaky, clock=FakeClock())
    auth.authority.store_wait = 0.2
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="hang")
    flaky.hold = trio.Event()
    refusals: list[StoreUnavailable] = []

    async def check() -> None:
        with pytest.raises(StoreUnavailable) as refused:
            await auth.authenticate_bearer(token)
        refusals.append(refused.value)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(check)
    assert len(refusals) == 5 and refusals[0].headers == {"Retry-After": "1"}
    assert flaky.reads == 1, "concurrent checks of one credential share one read"
    flaky.hold.set()
    flaky.hold = None
    with trio.fail_after(5):
        assert (await auth.authenticate_bearer(token)).scopes == frozenset(PROJECT_SCOPES)


async def test_revocations_are_still_watched_after_the_store_failed(service, bootstrap):
    clock = FakeClock()
    flaky = FlakyStore(service.store)
    auth = AuthService(flaky, clock=clock)
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="watched")
    principal = await auth.authenticate_bearer(token)
    flaky.fail = True
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(auth.watch_revocations, 0.01)
            await eventually(lambda: flaky.reads >= 4, None, every=0.01)
            flaky.fail = False
            await service.store.write(
                lambda tx: tx.execute(
                    "UPDATE credentials SET revoked_at = ? WHERE id = ?",
                    (clock.now + 1, principal.id),
                )
            )
            await eventually(lambda: not auth.still_valid(principal), None, every=0.01)
            nursery.cancel_scope.cancel()


async def test_a_session_check_with_the_store_down_is_503_not_401(service, bootstrap):
    flaky = FlakyStore(service.store)
    auth = AuthService(flaky, clock=FakeClock(time.time()))
    # Logged in through another process: never verified by this one (a session verified
    # here is served from memory while the store is down: test_store_outage_parts.py).
    _, cookie, _ = await service.auth.login("admin", bootstrap["password"], "default")
    flaky.fail = True
    with pytest.raises(StoreUnavailable) as refused:
        await auth.authenticate_session(cookie)
    assert (refused.value.status, refused.value.code) == (503, "store_unavailable")


async def test_a_verified_key_waits_once_per_cache_period_for_a_hanging_store(service, bootstrap):
    clock = FakeClock()
    flaky = FlakyStore(service.store)
    auth = AuthService(flaky, clock=clock)
    auth.authority.store_wait = 0.2
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="stale")
    principal = await auth.authenticate_bearer(token)
    clock.now += 60  # long past the cache period
    flaky.hold = trio.Event()
    with trio.fail_after(5):
        assert await auth.authenticate_bearer(token) == principal  # after one bounded wait
        for _ in range(5):
            assert await auth.authenticate_bearer(token) == principal
    assert flaky.reads == 2, "one read to verify, one that hung; then memory"
    flaky.hold.set()
