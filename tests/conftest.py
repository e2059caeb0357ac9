"""Shared fixtures: a real controller on a real SQLite file in a temporary directory, or
on a real PostgreSQL database (tests/support/pg_support.py) where a test asks for both backends."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from ficc_core.api.app import create_app
from ficc_core.auth import ALL_SCOPES
from ficc_core.config import Config, load_config
from ficc_core.controller.service import Service, open_service
from ficc_core.store import Store, open_sqlite_store

from .support import deadline, pg_support
from .support.httpsd import open_https_server, write_ca_bundle
from .support.serve_support import ServeProcess


@pytest.hookimpl(trylast=True)  # after pytest-trio marked the async tests as trio tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every trio test here runs under a deadline: 10 s unless marked ``deadline(SECONDS)``."""
    here = Path(__file__).parent
    deadline.apply(item for item in items if here in item.path.parents)


@pytest.fixture(scope="session", autouse=True)
def _engine_sockets_of_this_session() -> Iterator[Path]:
    """The engines' sockets of every controller and agent this session starts in a short
    runtime directory of its own (FICC_RUNTIME_DIR), removed at its end: a test that
    kills a controller outright leaves its engines' socket directories behind, which
    nothing would remove from the user's /tmp/ficc-<uid>."""
    path = Path(tempfile.mkdtemp(prefix="ficc-t", dir="/tmp"))
    before = os.environ.get("FICC_RUNTIME_DIR")
    os.environ["FICC_RUNTIME_DIR"] = str(path)
    # Every `ficc serve` of the session: a 1 MiB blob-disk reserve, not 32 MiB in each
    # test's data directory (tests of a full disk set their own).
    os.environ.setdefault("FICC_STORAGE_RESERVE", str(1 << 20))
    yield path
    if before is None:
        os.environ.pop("FICC_RUNTIME_DIR", None)
    else:
        os.environ["FICC_RUNTIME_DIR"] = before
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_user_config(tmp_path_factory, monkeypatch) -> Path:
    """A user configuration directory of the test's own: no stored `ficc login` leaks in."""
    folder = tmp_path_factory.mktemp("xdg-config")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder))
    return folder


@pytest.fixture
def config(request, tmp_path: Path) -> Config:
    """The controller's settings: SQLite in tmp_path/data; with FICC_TEST_BACKEND=postgresql
    every test of this fixture runs on a fresh PostgreSQL database instead."""
    overrides = {"data_dir": str(tmp_path / "data")}
    if os.environ.get("FICC_TEST_BACKEND") == "postgresql":
        overrides["database_url"] = request.getfixturevalue("pg_url")
    return load_config(overrides=overrides, environ={})


# -- PostgreSQL (tests/support/pg_support.py) ---------------------------------------------------
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg_support.PostgresServer]:
    """The test session's one PostgreSQL server (started on first use)."""
    reason = pg_support.missing()
    if reason is not None:
        pg_support.unavailable(reason)
    pg_support.reap_stale()
    server = pg_support.PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server: pg_support.PostgresServer) -> Iterator[str]:
    """A libpq URL for this test's own fresh, empty database (dropped afterwards)."""
    name = pg_server.create_database()
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def pg_own_server() -> Iterator[pg_support.PostgresServer]:
    """A PostgreSQL server of this test's own, for a test that stops and starts it."""
    reason = pg_support.missing()
    if reason is not None:
        pg_support.unavailable(reason)
    server = pg_support.PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Each backend in turn: "sqlite", then "postgresql"."""
    return request.param


@pytest.fixture
def database_url(request, backend: str) -> str:
    """The ``database_url`` setting for :func:`backend`: "" (SQLite in data_dir), or a
    fresh PostgreSQL database's URL."""
    return request.getfixturevalue("pg_url") if backend == "postgresql" else ""


@pytest.fixture
def backend_config(tmp_path: Path, database_url: str) -> Config:
    """:func:`config` on each backend; a module runs its tests on both with
    ``config = backend_config`` wrapped as its own ``config`` fixture."""
    return load_config(
        overrides={"data_dir": str(tmp_path / "data"), "database_url": database_url}, environ={}
    )


async def open_same_store(store: Store) -> Store:
    """Another store on ``store``'s database: another process's, another controller's."""
    if store.backend == "postgresql":  # type: ignore[attr-defined]
        from ficc_core.store.postgres import open_postgres_store

        return await open_postgres_store(store.url)  # type: ignore[attr-defined]
    return await open_sqlite_store(store.path)  # type: ignore[attr-defined]


@pytest.fixture
async def store_backend(tmp_path: Path, database_url: str) -> AsyncIterator[Store]:
    """An opened, migrated, empty store of each backend in turn (closed afterwards)."""
    if database_url:
        from ficc_core.store.postgres import open_postgres_store

        store: Store = await open_postgres_store(database_url)
    else:
        store = await open_sqlite_store(tmp_path / "ficc.sqlite3")
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
async def service(config: Config) -> AsyncIterator[Service]:
    with trio.fail_after(30):
        async with open_service(config) as opened:
            yield opened


@pytest.fixture
async def bootstrap(service: Service) -> dict[str, str]:
    created = await service.auth.bootstrap()
    assert created is not None
    return created


@pytest.fixture
def app(service: Service):
    return create_app(service)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_bundle(tmp_path, ca) -> Path:
    return write_ca_bundle(tmp_path, ca)


@pytest.fixture
async def https_server(ca):
    async with open_https_server(ca) as server:
        yield server


@pytest.fixture
async def serve_process(tmp_path, ca_bundle):
    """A real `ficc serve` subprocess trusting the test CA and allowing loopback fetches.

    Yields ``(url, admin_token)``; the process is stopped afterwards.
    """
    config = tmp_path / "ficc.toml"
    config.write_text(f'ca_bundle = "{ca_bundle}"\nallow_private_addresses = true\n')
    server = ServeProcess(tmp_path / "data", config=config)
    try:
        url = await server.wait_ready()
        yield url, await server.admin_token()
    finally:
        server.proc.terminate()
        server.kill()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def issue_token(
    service: Service, project: str = "default", scopes=ALL_SCOPES, **kwargs
) -> str:
    """Create a credential directly through the auth service and return its token (named
    ``test``, ``test-2``... unless named: names are unique among live credentials)."""
    kwargs.setdefault("generated_name", "name" not in kwargs)
    _, token = await service.auth.create_credential(
        project, name=kwargs.pop("name", "test"), scopes=frozenset(scopes), **kwargs
    )
    return token


class LiveServer:
    """A real controller served by hypercorn on 127.0.0.1 (OS-chosen port) in a thread."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.url = ""
        self.bootstrap: dict[str, str] = {}
        self.service: Service | None = None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from ficc_core.controller.server import serve_http

        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with open_service(self.config) as service:
            self.service = service
            self.bootstrap = await service.auth.bootstrap() or {}
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(
                    lambda task_status: serve_http(
                        service, shutdown_trigger=self._stop.wait, task_status=task_status
                    )
                )
                self.url = urls[0]
                self._ready.set()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the live server did not start: {self._error!r}")
        return self

    def call(self, function, *args):
        """Run the synchronous ``function(*args)`` on the server's event loop (e.g. to
        publish a service view, as the reconciler does); return its result."""
        return trio.from_thread.run_sync(function, *args, trio_token=self._token)

    def __exit__(self, *exc_info) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the live server did not stop"


@pytest.fixture(scope="module")
def live_server(request, tmp_path_factory) -> Iterator[LiveServer]:
    """A live controller for the module; with FICC_TEST_BACKEND=postgresql, on a database
    of its own on the session's PostgreSQL server."""
    data = tmp_path_factory.mktemp("live")
    overrides: dict[str, object] = {"data_dir": str(data), "port": 0}
    database = None
    if os.environ.get("FICC_TEST_BACKEND") == "postgresql":
        pg = request.getfixturevalue("pg_server")
        database = pg.create_database()
        overrides["database_url"] = pg.url(database)
    config = load_config(overrides=overrides, environ={})
    try:
        with LiveServer(config) as server:
            yield server
    finally:
        if database is not None:
            pg.drop_database(database)
