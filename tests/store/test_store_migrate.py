"""`ficc admin migrate-store`: a real SQLite store holding the repositories' data is copied
into a real PostgreSQL database, row for row, in one transaction; a destination holding
data is refused with nothing written; IDs continue past the source's."""

from __future__ import annotations

import json
import os
import sqlite3

import psycopg
import pytest
import trio

from ficc_core.api.app import create_app
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.events import EventKind, Subject, record
from ficc_core.events import repository as events
from ficc_core.inference import repository as inference
from ficc_core.inference.records import Reservation
from ficc_core.schema import ModelManifest, structure
from ficc_core.usage import repository as usage
from ficc_core.usage.records import UsageRecord

from ..conftest import bearer, issue_token
from ..inference.test_inference_repository import _attempt, _service
from ..support.models_support import gguf_manifest
from ..support.serve_support import FICC


def _event(tx, at: float):
    return record(
        tx,
        at=at,
        kind=EventKind.SERVICE_STATE,
        subject=Subject.SERVICE,
        subject_id="svc_a",
        service_id="svc_a",
        reason="x",
        message="state",
        details={"state": {"from": "a", "to": "b"}},
    )


def _usage(finished_at: float) -> UsageRecord:
    return UsageRecord(
        service_id="svc_a",
        generation=1,
        replica="r0",
        node_id="gpu-1",
        credential_id="cred",
        path="/v1/chat/completions",
        status=200,
        outcome="ok",
        prompt_tokens=3,
        completion_tokens=5,
        queue_wait=0.0,
        ttfb=0.1,
        duration=0.5,
        finished_at=finished_at,
    )


async def _fill(data_dir) -> tuple[str, int]:
    """An SQLite installation with users, credentials, a model, a service with its attempt
    and reservation, usage and events (the newest pruned); return a token and the
    highest event ID handed out."""
    config = load_config(overrides={"data_dir": str(data_dir)}, environ={})
    async with open_service(config) as service:
        await service.auth.bootstrap()
        token = await issue_token(service, name="kept")
        project = await service.store.read(lambda tx: tx.fetch_one("SELECT id FROM projects"))
        manifest = structure(gguf_manifest("m", b"0123456789"), ModelManifest, what="manifest")
        await service.models.register(project["id"], manifest)
        held = Reservation(
            service_id="svc_a", replica=0, node_id="gpu-1", cpus=2, memory_bytes=8, gpus=((1, 4),)
        )

        def write(tx) -> int:
            inference.insert_service(tx, _service(project["id"]))
            inference.insert_attempt(tx, _attempt())
            inference.insert_reservations(tx, [held], 2.0)
            usage.insert_usage(tx, [_usage(1.0 + i) for i in range(5)])
            ids = [_event(tx, 10.0 + i).id for i in range(4)]
            tx.execute("DELETE FROM events WHERE id = ?", (ids[-1],))  # pruned: never reused
            return ids[-1]

        highest = await service.store.write(write)
    return token, highest


def _rows(fetch, table: str) -> list[tuple]:
    return sorted((tuple(row) for row in fetch(f'SELECT * FROM "{table}"')), key=repr)


async def _migrate(source, url) -> trio.CompletedProcess:
    return await trio.run_process(
        [*FICC, "admin", "migrate-store", "--from", f"sqlite:{source}", "--to", url, "--json"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


@pytest.mark.deadline(130)
async def test_migrate_store_copies_every_row_and_the_copy_serves(tmp_path, pg_url):
    data = tmp_path / "data"
    token, highest = await _fill(data)
    source = data / "ficc.sqlite3"
    with trio.fail_after(120):
        done = await _migrate(source, pg_url)
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    src = sqlite3.connect(source)
    tables = [
        r[0]
        for r in src.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    assert sorted(report["tables"]) == sorted(tables)
    assert report["rows"] == sum(report["tables"].values()) > 10
    with psycopg.connect(pg_url) as dst:
        for table in tables:
            expected = _rows(lambda sql: src.execute(sql).fetchall(), table)
            assert _rows(lambda sql: dst.execute(sql).fetchall(), table) == expected, table
            assert report["tables"][table] == len(expected)
    src.close()

    # `ficc admin` works on the copy through database_url, with no SQLite file around.
    env = {**os.environ, "FICC_DATA_DIR": str(tmp_path / "other"), "FICC_DATABASE_URL": pg_url}
    listed = await trio.run_process(
        [*FICC, "admin", "list-projects", "--json"], capture_stdout=True, env=env
    )
    assert "default" in [p["name"] for p in json.loads(listed.stdout)]

    # A controller on the copy: the same credential works, IDs go on past the source's.
    config = load_config(
        overrides={"data_dir": str(tmp_path / "other"), "database_url": pg_url}, environ={}
    )
    async with open_service(config) as service:
        client = create_app(service).test_client()
        whoami = await client.get("/api/v1/whoami", headers=bearer(token))
        assert whoami.status_code == 200
        event = await service.store.write(lambda tx: _event(tx, 20.0))
        assert event.id == highest + 1
        listed = await service.store.read(lambda tx: events.for_service(tx, "svc_a", limit=10))
        assert [e.id for e in listed] == [highest - 3, highest - 2, highest - 1, highest + 1]
        detail = await service.store.read(lambda tx: inference.detail(tx, "svc_a"))
        assert detail.service.alias == "a" and len(detail.reservations) == 1


@pytest.mark.deadline(130)
async def test_a_destination_holding_data_is_refused_and_nothing_is_written(tmp_path, pg_url):
    data = tmp_path / "data"
    await _fill(data)
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE projects (id TEXT, name TEXT, created_at REAL)")
        conn.execute("INSERT INTO projects VALUES ('x', 'already here', 1)")
    with trio.fail_after(120):
        done = await _migrate(data / "ficc.sqlite3", pg_url)
    assert done.returncode == 3, done.stderr.decode()
    assert "already holds data" in done.stderr.decode()
    assert "store_not_empty" in done.stderr.decode()
    with psycopg.connect(pg_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == [("projects",)]  # not even the schema was left behind
        assert conn.execute("SELECT count(*) FROM projects").fetchone() == (1,)


@pytest.mark.deadline(130)
async def test_a_second_copy_onto_a_migrated_destination_is_refused(tmp_path, pg_url):
    data = tmp_path / "data"
    await _fill(data)
    with trio.fail_after(120):
        assert (await _migrate(data / "ficc.sqlite3", pg_url)).returncode == 0
        again = await _migrate(data / "ficc.sqlite3", pg_url)
    assert again.returncode == 3
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM users").fetchone() == (1,)


@pytest.mark.deadline(60)
async def test_wrong_arguments_are_refused_before_anything_is_touched(tmp_path):
    done = await trio.run_process(
        [*FICC, "admin", "migrate-store", "--from", str(tmp_path), "--to", "mysql://x"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 2 and b"sqlite:PATH" in done.stderr
    missing = await _migrate(tmp_path / "none.sqlite3", "postgresql://u@127.0.0.1:1/x")
    assert missing.returncode == 1 and b"no SQLite database" in missing.stderr
