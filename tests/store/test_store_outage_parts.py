"""Each part of a controller that meets a store outage, on a real SQLite store switched
down (:mod:`.store_faults`): credentials, browser sessions, the API's envelope, the
node registry's expiry."""

from __future__ import annotations

import re
import sqlite3

import pytest
import trio

from ficc_core.auth.authority import Authority
from ficc_core.base.errors import StoreUnavailable
from ficc_core.contributors import NodeRegistry

from ..conftest import bearer
from ..contributors.test_contributors import _snapshot
from ..models.test_models_acquire import MiB, _api, controller  # noqa: F401
from ..support.clock import FakeClock
from ..support.httpsd import ServedFile
from ..support.models_support import gguf_manifest, random_bytes
from ..support.store_faults import store_outage
from ..support.waiting import eventually


@pytest.mark.deadline(41)
async def test_a_credential_verified_before_is_served_at_once_while_the_store_fails(
    service, bootstrap
):
    clock = FakeClock()
    authority = Authority(service.store, clock=clock, cache_seconds=5, store_wait=30)
    token = bootstrap["token"]
    with trio.fail_after(10):
        known = await authority.authenticate_bearer(token)
    clock.now += 60  # its cache entry is stale: the store would be asked
    with store_outage(service.store) as outage:
        outage.down = True
        with trio.fail_after(10):
            assert (await authority.authenticate_bearer(token)).id == known.id
        # The store keeps failing, now without answering at all: a known credential
        # does not wait for it (store_wait is 30 s), it is served from memory at once.
        outage.hang = True
        clock.now += 60
        with trio.fail_after(1):
            assert (await authority.authenticate_bearer(token)).id == known.id
        assert authority.store_failing
    # The store answers again: the read that check started in the background says so,
    # and the next check after the cache period reads the store again.
    clock.now += 60
    with trio.fail_after(10):
        assert (await authority.authenticate_bearer(token)).id == known.id
        await eventually(lambda: not authority.store_failing, None, every=0.01)


async def test_a_credential_never_seen_is_503_store_unavailable_not_401(service, bootstrap):
    _, token = await service.auth.create_credential(
        "default", name="unseen", scopes=frozenset({"inference:read"})
    )
    with store_outage(service.store) as outage, trio.fail_after(10):
        outage.down = True
        with pytest.raises(StoreUnavailable) as refused:
            await service.auth.authenticate_bearer(token)
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"


@pytest.mark.deadline(40)
async def test_a_browser_session_verified_before_is_served_while_the_store_fails(
    service, bootstrap
):
    with trio.fail_after(30):
        _, cookie, _ = await service.auth.login("admin", bootstrap["password"], "default")
        _, ended, _ = await service.auth.login("admin", bootstrap["password"], "default")
        known = await service.auth.authenticate_session(cookie)
        gone = await service.auth.authenticate_session(ended)
        await service.auth.logout(gone.id)
        with store_outage(service.store) as outage:
            outage.down = True
            assert (await service.auth.authenticate_session(cookie)).id == known.id
            # One logged out is never served from memory; a wrong secret is not either.
            with pytest.raises(StoreUnavailable):
                await service.auth.authenticate_session(ended)
            with pytest.raises(StoreUnavailable):
                await service.auth.authenticate_session(cookie[:-4] + "abcd")


@pytest.mark.parametrize("raw", [False, True], ids=["store_unavailable", "driver_error"])
async def test_a_management_route_is_a_503_envelope_with_retry_after(
    service, client, bootstrap, raw
):
    headers = bearer(bootstrap["token"])
    with trio.fail_after(10):
        assert (await client.get("/api/v1/inference", headers=headers)).status_code == 200
        with store_outage(service.store) as outage:
            outage.down, outage.raw = True, raw
            response = await client.get("/api/v1/inference", headers=headers)
            body = await response.get_json()
    assert response.status_code == 503
    assert body["error"]["code"] == "store_unavailable"
    assert "Traceback" not in str(body)
    assert int(response.headers["Retry-After"]) >= 1


@pytest.mark.deadline(40)
async def test_node_silence_counts_from_the_stores_return_not_through_the_outage(service):
    clock = FakeClock()
    nodes = NodeRegistry(service.store, unreachable_after=2, lost_after=4, clock=clock)
    with trio.fail_after(30):
        await nodes.add_node("gpu-1")
        connection = await nodes.connect("gpu-1")
        assert (await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"))) is not None
        async with trio.open_nursery() as nursery:
            with store_outage(service.store) as outage:
                await nursery.start(nodes.run)
                started = nodes.states.resumed_at  # silence counts from the sweep's start
                assert started == clock.now
                outage.down = True
                clock.now += 1
                # Heard, not recorded: the connection goes on (no error is raised).
                assert (await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"))) is None
                clock.now += 100  # far past lost_after while the store is down
                await eventually(lambda: nodes.states.outage.failures >= 3, None, every=0.01)
                outage.end()
                await eventually(lambda: nodes.states.resumed_at != started, None, every=0.01)
            assert await nodes.sweep() == []  # the outage was not the node's silence
            assert (await nodes.get("gpu-1")).state == "connected"
            clock.now += 2.5  # silent since the store's return, past unreachable_after
            assert await nodes.sweep() == [("gpu-1", "unreachable")]
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(30)
async def test_no_route_answers_a_500_while_the_store_is_down(service, app, client, bootstrap):
    """Every route of the table, with placeholders in its path and an empty JSON body:
    what needs the store is 503 store_unavailable with Retry-After; nothing is a 500."""
    headers = bearer(bootstrap["token"])
    with trio.fail_after(10):
        assert (await client.get("/api/v1/whoami", headers=headers)).status_code == 200
    answered: dict[int, list[str]] = {}
    with store_outage(service.store) as outage:
        outage.down = True
        for rule in app.url_map.iter_rules():
            path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: _placeholder(m.group(1)), rule.rule)
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                with trio.fail_after(10):
                    response = await client.open(path, method=method, headers=headers, json={})
                answered.setdefault(response.status_code, []).append(f"{method} {rule.rule}")
                if response.status_code >= 500:
                    body = await response.get_json()
                    assert body["error"]["code"] == "store_unavailable", (method, rule.rule, body)
                    assert int(response.headers["Retry-After"]) >= 1
    assert 500 not in answered
    assert len(answered.get(503, [])) > 20, answered  # most routes read the store


def _placeholder(name: str) -> str:
    return {"index": "0", "replica": "0", "file_index": "0"}.get(name, f"x-{name}")


@pytest.mark.deadline(30)
async def test_an_acquisition_waits_out_an_outage_and_resumes(
    controller,  # noqa: F811
    https_server,
    caplog,
):
    content = random_bytes(2 * MiB + 17, seed=5)
    https_server.add("/m.gguf", ServedFile(content, chunk_delay=0.01))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        with store_outage(service.store) as outage:
            response = await api.post(f"/api/v1/models/{model['id']}/acquire")
            assert response.status_code == 202
            outage.down = True  # while the file downloads (a piece every 10 ms)
            with trio.fail_after(20):
                await eventually(
                    lambda: any("model acquisitions" in r.message for r in caplog.records),
                    None,
                    every=0.01,
                )
        # The store is back: the acquisition (still running on record) resumes and ends.
        done = await api.wait_until(
            model["id"],
            lambda m: m["state"] == "verified" and m["acquisition"]["state"] == "done",
        )
        assert done["files"][0]["state"] == "verified"


def test_what_counts_as_a_store_outage_and_what_is_a_defect():
    from ficc_core.store.outage import is_store_failure

    down = StoreUnavailable("no connection within 1 s")
    assert is_store_failure(down)
    assert is_store_failure(sqlite3.OperationalError("database is locked"))
    assert is_store_failure(sqlite3.OperationalError("disk I/O error"))
    assert is_store_failure(ExceptionGroup("tasks", [down, StoreUnavailable("again")]))
    # A defect is not an outage: it stays a 500 with a reference, and shows.
    assert not is_store_failure(sqlite3.OperationalError("no such column: nope"))
    assert not is_store_failure(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not is_store_failure(ExceptionGroup("tasks", [down, KeyError("x")]))
    assert not is_store_failure(RuntimeError("the database is down"))
