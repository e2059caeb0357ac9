"""Every wait on PostgreSQL is bounded: no lost peer can hold the installation (#46).

- A controller frozen inside a write (its session ``idle in transaction`` holding the
  write lock): another controller's write is refused 503 within ``store_lock_timeout``
  (never held), the leader lease is claimed at once beside it (its own lock), and the
  server ends the frozen session after ``store_lock_timeout``, so writes go on.
- A database that hangs (a TCP proxy that stops forwarding without closing anything):
  every call, more of them than connections, ends within its deadline with 503
  ``store_unavailable``, no worker thread stays stuck, and the store works again by
  itself once the proxy forwards again; a real ``ficc serve`` answers its routes so.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import trio

from ficc_core.base.errors import StoreUnavailable
from ficc_core.controller.lease import LeaderLease
from ficc_core.store.postgres import WRITE_LOCK, open_postgres_store

from ..support.ha_support import Api, ControllerProcess, controller_env
from ..support.serve_support import first_run_secrets
from ..support.tcp_proxy import tcp_proxy
from ..support.waiting import eventually

#: A controller's store bounds in the process test (pool wait, statement bounds, lock).
BOUNDS = {
    "store_pool_timeout": "1s",
    "store_read_timeout": "1s",
    "store_write_timeout": "2s",
    "store_lock_timeout": "1s",
}


def _write_lock_holders(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = %s",
            (WRITE_LOCK,),
        ).fetchone()[0]


def _event(tx, subject_id: str) -> None:
    tx.execute(
        "INSERT INTO events (at, kind, subject, subject_id) VALUES (1, 'test', 's', ?)",
        (subject_id,),
    )


@pytest.mark.deadline(40)
async def test_a_controller_frozen_inside_a_write_holds_nobody(pg_url):
    frozen = await open_postgres_store(pg_url, pool_size=2, lock_timeout=3)
    other = await open_postgres_store(pg_url, pool_size=3, pool_timeout=2, lock_timeout=1)
    inside, thaw = threading.Event(), threading.Event()
    outcome: dict[str, BaseException | None] = {}

    def stuck(tx) -> None:
        _event(tx, "frozen")
        inside.set()
        thaw.wait(30)  # a paused process: its transaction stays open, idle

    async def frozen_write() -> None:
        try:
            await frozen.write(stuck)
            outcome["frozen"] = None
        except BaseException as exc:
            outcome["frozen"] = exc

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(frozen_write)
                await trio.to_thread.run_sync(inside.wait)
                assert await trio.to_thread.run_sync(_write_lock_holders, pg_url) == 1
                began = trio.current_time()

                # The leader lease is claimed beside the held write lock, at once.
                lease = LeaderLease(
                    other, controller_id="ctl-b", url="http://b", duration=5, renew_interval=1
                )
                await lease.tick()
                assert lease.leading
                assert trio.current_time() - began < 1.5

                # A write refused within store_lock_timeout (1 s), never held.
                started = trio.current_time()
                with pytest.raises(StoreUnavailable) as refused:
                    await other.write(lambda tx: _event(tx, "blocked"))
                assert trio.current_time() - started < 2.5
                assert refused.value.headers["Retry-After"] == "1"
                assert refused.value.details["waited"] == "write_lock"
                assert "store_lock_timeout" in refused.value.message

                # The server ends the frozen session (idle in a transaction for over its
                # 3 s) and its lock with it: writes go through again, within that bound.
                while True:
                    try:
                        await other.write(lambda tx: _event(tx, "after"))
                        break
                    except StoreUnavailable:
                        await trio.sleep(0.2)
                assert trio.current_time() - began < 3 + 2.5
                thaw.set()
        # The frozen controller, thawed, finds its transaction gone: nothing of it stands.
        assert isinstance(outcome["frozen"], StoreUnavailable), outcome
        rows = await other.read(
            lambda tx: tx.fetch_all("SELECT subject_id FROM events WHERE kind = 'test'")
        )
        assert sorted(r["subject_id"] for r in rows) == ["after"]
    finally:
        thaw.set()
        await frozen.aclose()
        await other.aclose()


@pytest.mark.deadline(70)
async def test_a_hung_database_is_refused_within_the_deadline_and_recovers(pg_url):
    info = psycopg.conninfo.conninfo_to_dict(pg_url)
    async with tcp_proxy("127.0.0.1", int(info["port"])) as proxy:
        url = psycopg.conninfo.make_conninfo(pg_url, host="127.0.0.1", port=proxy.port)
        store = await open_postgres_store(
            url, pool_size=2, pool_timeout=1, read_timeout=1, write_timeout=2, lock_timeout=1
        )
        try:
            with trio.fail_after(60):
                row = await store.read(lambda tx: tx.fetch_one("SELECT 1 AS one"))
                assert row == {"one": 1}
                proxy.pause()
                # The deadlines: pool wait + statement bound + 1 s.
                bounds = {"read": 1 + 1 + 1, "write": 1 + 2 + 1}
                ended: list[tuple[str, float, BaseException | None]] = []

                async def call(kind: str) -> None:
                    started = trio.current_time()
                    try:
                        if kind == "read":
                            await store.read(lambda tx: tx.fetch_one("SELECT 1 AS one"))
                        else:
                            await store.write(lambda tx: _event(tx, "hung"))
                        error = None
                    except BaseException as exc:
                        error = exc
                    ended.append((kind, trio.current_time() - started, error))

                async with trio.open_nursery() as nursery:
                    for kind in ("read", "write") * 3:  # six calls, two connections
                        nursery.start_soon(call, kind)
                assert len(ended) == 6
                for kind, took, error in ended:
                    assert isinstance(error, StoreUnavailable), (kind, error)
                    assert error.headers["Retry-After"] in ("1", "2")
                    assert took <= bounds[kind] + 1, (kind, took)

                # No worker thread stays stuck on the hung connections: each was shut
                # down under its thread, which ended and gave its slot back.
                await eventually(
                    lambda: not store._limiter._limiter.borrowed_tokens, None, every=0.05
                )

                # It works again by itself once the database answers.
                proxy.resume()
                resumed = trio.current_time()
                while True:
                    try:
                        await store.write(lambda tx: _event(tx, "back"))
                        break
                    except StoreUnavailable:
                        await trio.sleep(0.2)
                row = await store.read(lambda tx: tx.fetch_one("SELECT 1 AS one"))
                assert row == {"one": 1}
                assert trio.current_time() - resumed < 10
        finally:
            proxy.resume()
            await store.aclose()


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_ficc_serve_on_a_hung_database_answers_503_and_recovers(tmp_path, pg_url):
    """A real controller whose database hangs (the proxy stops forwarding): a write and
    a read route are refused 503 ``store_unavailable`` with ``Retry-After`` within their
    deadlines, the health route and a credential it verified before still answer, and
    the same write goes through by itself once the database answers again."""
    info = psycopg.conninfo.conninfo_to_dict(pg_url)
    async with tcp_proxy("127.0.0.1", int(info["port"])) as proxy:
        parts = urlsplit(pg_url)
        through = urlunsplit(
            parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{proxy.port}")
        )
        data = tmp_path / "data"
        controller = ControllerProcess(
            controller_env(data, through, "ctl-a", **BOUNDS), tmp_path / "serve.log"
        )
        try:
            with trio.fail_after(120):
                url = await controller.start()
                token = first_run_secrets(data / "first-run-secrets")["admin token"]
                async with httpx.AsyncClient(timeout=60) as http:
                    api = Api(url, token, http)
                    await api.ok("GET", "/api/v1/tokens")  # the credential is verified
                    proxy.pause()
                    for method, path, body, bound in (
                        (
                            "POST",
                            "/api/v1/tokens",
                            {"name": "hung", "scopes": ["models:read"]},
                            1 + 2 + 1,
                        ),
                        ("GET", "/api/v1/tokens", None, 1 + 1 + 1),
                    ):
                        began = time.monotonic()
                        answer = await api.call(method, path, json=body)
                        took = time.monotonic() - began
                        assert answer.status_code == 503, answer.text
                        assert answer.json()["error"]["code"] == "store_unavailable"
                        assert answer.headers["Retry-After"] in ("1", "2")
                        # The credential check's own wait (authority) comes first.
                        assert took <= bound + 3 + 1.5, (path, took)
                    began = time.monotonic()
                    health = await http.get(f"{url}/api/v1/health")
                    assert health.status_code == 200
                    assert time.monotonic() - began < 2

                    proxy.resume()
                    while True:
                        answer = await api.call(
                            "POST",
                            "/api/v1/tokens",
                            json={"name": "back", "scopes": ["models:read"]},
                        )
                        if answer.status_code == 201:
                            break
                        assert answer.status_code == 503, answer.text
                        await trio.sleep(0.2)
        finally:
            proxy.resume()
            controller.stop()
