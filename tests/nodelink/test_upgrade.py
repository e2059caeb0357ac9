"""Rolling upgrades: the node protocol's version and its negotiation, against a real
controller (docs/agents.md, "Protocol versions"; docs/operations.md, "Upgrading a fleet")."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from ficc_core.agent.remote import RemoteAgent, websocket_url
from ficc_core.nodelink.wire import PROTOCOL_HEADER
from ficc_core.schema import unstructure

from ..controller.test_ha_acceptance import _node_connected, _routed, _serve_smol
from ..support.agent_support import open_controller, process_agent_maker
from ..support.ha_support import (
    Api,
    ControllerProcess,
    add_node,
    controller_env,
    stop_process,
    stream_problem,
)
from ..support.inference_support import write_agent_settings
from ..support.serve_support import first_run_secrets
from ..support.waiting import eventually

#: Leases of a two-controller installation, short enough for a test (the leader's
#: replacement takes over within leader_lease + leader_renew_interval).
UPGRADE_TEMPO = {
    "leader_lease": "5s",
    "leader_renew_interval": "1s",
    "follow_interval": "0.5s",
    "lease_duration": "12s",
}


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fu-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _snapshot_document(agent_dir: Path) -> dict:
    agent = process_agent_maker(agent_dir)("gpu-1")
    return unstructure(await agent.snapshot())


def _headers(token: str, version: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    if version is not None:
        headers.append((PROTOCOL_HEADER.encode(), version.encode()))
    return headers


async def _connected(service, node_id: str):
    with trio.fail_after(10):
        while True:
            node = await service.contributors.get(node_id)
            if node.state == "connected" and node.snapshot is not None:
                return node
            await trio.sleep(0.05)


async def _last_word(ws) -> dict:
    """The controller's message that ends the connection (renewals skipped)."""
    with trio.fail_after(10):
        while True:
            message = json.loads(await ws.get_message())
            if message["type"] != "renew":
                return message


@pytest.mark.deadline(40)
async def test_agent_and_controller_negotiate_and_the_snapshot_says_its_version(
    tmp_path, agent_dir, monkeypatch
):
    import ficc_core.contributors.connection as connection

    sent: list[dict] = []
    real = connection.snapshot_from_wire

    def spy(data):
        sent.append(data)
        return real(data)

    monkeypatch.setattr(connection, "snapshot_from_wire", spy)
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
            async with trio.open_nursery() as nursery:
                await nursery.start(remote.run)
                [link] = remote.links
                assert link.protocol == (1, 1)
                node = await _connected(service, "gpu-1")
                assert sent and sent[0]["protocol_version"] == "1.1"
                # The version belongs to the wire: the stored snapshot is one an older
                # controller sharing the database reads.
                assert "protocol_version" not in node.snapshot
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_an_agent_before_versions_is_taken_as_1_0_and_served(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            snapshot = await _snapshot_document(agent_dir)
            async with open_websocket_url(
                websocket_url(url), extra_headers=_headers(token, None)
            ) as ws:
                welcome = json.loads(await ws.get_message())
                assert welcome["type"] == "welcome" and welcome["node_id"] == "gpu-1"
                assert welcome["protocol_version"] == "1.1"
                heartbeat = {"type": "heartbeat", "snapshot": snapshot, "attempts": []}
                await ws.send_message(json.dumps(heartbeat))
                node = await _connected(service, "gpu-1")
                assert node.snapshot["node_id"] == "gpu-1"


@pytest.mark.deadline(40)
async def test_a_newer_agents_unknown_snapshot_fields_are_ignored_known_ones_kept(
    tmp_path, agent_dir, caplog
):
    caplog.set_level(logging.INFO, logger="ficc.contributors")
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            snapshot = await _snapshot_document(agent_dir)
            newer = {
                **snapshot,
                "protocol_version": "1.2",
                "power_watts": 300,
                "resources": {**snapshot["resources"], "numa_nodes": 2},
            }
            async with open_websocket_url(
                websocket_url(url), extra_headers=_headers(token, "1.2")
            ) as ws:
                json.loads(await ws.get_message())
                heartbeat = {"type": "heartbeat", "snapshot": newer, "attempts": []}
                await ws.send_message(json.dumps(heartbeat))
                node = await _connected(service, "gpu-1")
                assert node.snapshot == snapshot  # the known fields, exactly as sent
                assert "ignored: $.resources.numa_nodes, $.power_watts" in caplog.text

                # A known field is checked as strictly as ever: the connection ends.
                bent = {**newer, "endpoint_version": "1"}
                await ws.send_message(json.dumps({**heartbeat, "snapshot": bent}))
                ended = await _last_word(ws)
                assert ended["type"] == "error" and ended["code"] == "bad_heartbeat"
                assert "$.endpoint_version" in ended["message"]


@pytest.mark.deadline(40)
async def test_the_same_unknown_field_from_an_agent_of_this_version_is_refused(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            snapshot = await _snapshot_document(agent_dir)
            document = {**snapshot, "protocol_version": "1.1", "power_watts": 300}
            async with open_websocket_url(
                websocket_url(url), extra_headers=_headers(token, "1.1")
            ) as ws:
                json.loads(await ws.get_message())
                heartbeat = {"type": "heartbeat", "snapshot": document, "attempts": []}
                await ws.send_message(json.dumps(heartbeat))
                ended = await _last_word(ws)
                assert ended["type"] == "error" and ended["code"] == "bad_heartbeat"
                assert "$.power_watts: unknown field" in ended["message"]


@pytest.mark.parametrize(
    ("version", "upgrade"), [("1.3", "controller"), ("2.1", "controller"), ("0.9", "agent")]
)
@pytest.mark.deadline(40)
async def test_an_agent_outside_the_window_is_refused_naming_what_to_upgrade(
    tmp_path, version, upgrade
):
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            with pytest.raises(ConnectionRejected) as refused:
                async with open_websocket_url(
                    websocket_url(url), extra_headers=_headers(token, version)
                ):
                    pass
            assert refused.value.status_code == 426
            error = json.loads(refused.value.body)["error"]
            assert error["code"] == "protocol_version_unsupported"
            assert error["details"] == {
                "agent_version": version,
                "controller_version": "1.1",
                "accepted": ["1.0", "1.2"],
                "upgrade": upgrade,
            }
            assert f"upgrade the {upgrade}" in error["message"]
            # Refused before it was registered: the node never connected.
            assert (await service.contributors.get("gpu-1")).state != "connected"


@pytest.mark.deadline(40)
async def test_a_refused_agent_says_what_to_upgrade_and_keeps_dialling(
    tmp_path, agent_dir, monkeypatch, caplog
):
    import ficc_core.agent.remote as remote_module

    caplog.set_level(logging.INFO, logger="ficc.agent")
    monkeypatch.setattr(remote_module, "PROTOCOL_VERSION", "1.3")
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            remote = RemoteAgent(url, token, process_agent_maker(agent_dir), backoff_initial=0.05)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(remote.run)
                [link] = remote.links
                await eventually(
                    lambda: caplog.text.count("protocol_version_unsupported") >= 2, None, every=0.05
                )
                assert "upgrade the controller" in caplog.text
                assert not link.connected and link.sessions == 0
                # The operator upgrades the controller (here: the agent comes back to a
                # version it accepts): the next dial is welcomed.
                monkeypatch.setattr(remote_module, "PROTOCOL_VERSION", "1.1")
                await _connected(service, "gpu-1")
                nursery.cancel_scope.cancel()


# -- expand-then-contract: controllers of adjacent versions share one database ---------------


def _next_release(monkeypatch, *, expand: bool) -> int:
    """Make this process the next release: one migration more, an expand or a contract."""
    import ficc_core.store.migrations as migrations
    import ficc_core.store.postgres as postgres

    added = [*migrations.MIGRATIONS, ("ALTER TABLE projects ADD COLUMN motto TEXT",)]
    monkeypatch.setattr(migrations, "MIGRATIONS", added)
    monkeypatch.setattr(postgres, "MIGRATIONS", added)
    if expand:
        monkeypatch.setattr(migrations, "EXPANDS", migrations.EXPANDS | {len(added)})
    return len(added)


def _schema(url: str) -> dict:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute("SELECT version, compatible_from FROM ficc_schema").fetchone()


@pytest.mark.deadline(70)
async def test_a_database_an_expand_migrated_keeps_the_release_before_working(
    tmp_path, pg_url, monkeypatch
):
    from ficc_core.store.migrations import MIGRATIONS
    from ficc_core.store.postgres import open_postgres_store

    known = len(MIGRATIONS)
    with trio.fail_after(60):
        newer = _next_release(monkeypatch, expand=True)
        store = await open_postgres_store(pg_url)
        await store.aclose()
        recorded = _schema(pg_url)
        assert recorded["version"] == newer and recorded["compatible_from"] <= known
        monkeypatch.undo()  # back to this release: one schema version behind

        async with open_controller(tmp_path, database_url=pg_url) as (service, _url):
            await service.contributors.add_node("gpu-1")  # a write, on the newer schema
            assert (await service.contributors.get("gpu-1")).name == "gpu-1"
        assert _schema(pg_url) == recorded  # never migrated back, nor marked again


@pytest.mark.deadline(70)
async def test_a_database_a_contract_migrated_refuses_the_release_before(pg_url, monkeypatch):
    from ficc_core.base.errors import StoreError
    from ficc_core.store.postgres import open_postgres_store

    with trio.fail_after(60):
        newer = _next_release(monkeypatch, expand=False)
        store = await open_postgres_store(pg_url)
        await store.aclose()
        assert _schema(pg_url) == {"version": newer, "compatible_from": newer}
        monkeypatch.undo()
        with pytest.raises(StoreError) as refused:
            await open_postgres_store(pg_url)
        assert refused.value.details == {
            "schema_version": newer,
            "supported": newer - 1,
            "compatible_from": newer,
        }
        assert f"it needs schema version {newer} or newer" in refused.value.message


# -- the two-version upgrade, one process at a time, under continuous traffic ----------------


def _previous_release(work: Path) -> Path:
    """The release before node protocol versions, built from the git history into
    wheels and installed into a venv of its own; return that venv's Python.

    The wheels are built as any release's are (``pip wheel``, isolated); the venv gets
    the current venv's other packages for dependencies (never its FICC packages).
    """
    repo = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, check=True, capture_output=True, text=True
        ).stdout.strip()

    first = git(
        "log", "--format=%H", "--reverse", "-S", "PROTOCOL_VERSION", "--",
        "ficc_core/nodelink/wire.py",
    ).splitlines()[0]  # fmt: skip
    previous = git("rev-parse", f"{first}~1")
    src = work / "src"
    src.mkdir(parents=True)
    packages = ["ficc_core", "executors/process", "adapters/llama_cpp", "runtimes/llama_server"]
    archive = subprocess.run(
        ["git", "archive", previous, "pyproject.toml", "README.md", *packages],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    wheels = work / "wheels"
    projects = [str(src), *(str(src / package) for package in packages[1:])]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), *projects],
        check=True,
        timeout=300,
    )
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = work / "deps"
    deps.mkdir()
    current = Path(sysconfig.get_paths()["purelib"])
    for entry in current.iterdir():
        if not entry.name.startswith(("ficc", "__editable__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    (Path(purelib) / "deps.pth").write_text(f"{deps}\n")
    subprocess.run(
        [*pip, "--python", str(python), "install", "-q", "--no-deps", "--no-index"]
        + [str(wheel) for wheel in sorted(wheels.glob("*.whl"))],
        check=True,
        timeout=300,
    )
    probe = subprocess.run(
        [str(python), "-c", "import ficc_core.nodelink.wire as w; print(w.__file__)"],
        cwd=work,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert probe.startswith(str(venv)), probe  # the old code, not this checkout's
    return python


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Controller(ControllerProcess):
    """One controller of the installation on a fixed port, run by ``python`` (the
    previous release's or this one's), from a directory outside the checkout."""

    def __init__(self, env, log: Path, python: Path | str, port: int, cwd: Path) -> None:
        super().__init__(env, log)
        self.python, self.port, self.cwd = str(python), port, cwd

    def spawn(self) -> int:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [self.python, "-m", "ficc_core", "serve", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
            )
        return offset


class _Executor:
    """``ficc executor`` of one version, linked to both controllers, its output in a file."""

    def __init__(
        self, python, urls, credential, agent_dir: Path, settings: Path, log: Path, cwd
    ) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "FICC_NODE_CREDENTIAL": credential}
        env.pop("FICC_CONFIG", None)
        command = [str(python), "-m", "ficc_core", "executor", "--agent-dir", str(agent_dir)]
        command += ["--agent-config", str(settings)]
        for url in urls:
            command += ["--controller", url]
        with log.open("a") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd
            )

    def stop(self) -> None:
        stop_process(self.proc)


@attrs.define
class _Traffic:
    """Streaming chat completions from ``clients`` clients through whichever controller
    the load balancer (``url``) points at now; every answer that is not a whole stream
    is a failure."""

    url: str
    service_id: str
    token: str
    completed: int = 0
    failures: list[str] = attrs.Factory(list)
    in_flight: dict[str, int] = attrs.Factory(dict)
    stop: trio.Event = attrs.Factory(trio.Event)

    async def run(self, clients: int = 2) -> None:
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
        body["stream"] = True

        async def client() -> None:
            async with httpx.AsyncClient(timeout=60) as http:
                while not self.stop.is_set():
                    url = self.url
                    path = f"{url}/api/v1/inference/{self.service_id}/v1/chat/completions"
                    self.in_flight[url] = self.in_flight.get(url, 0) + 1
                    headers = {"Authorization": f"Bearer {self.token}"}
                    try:
                        problem = await stream_problem(http, path, body, headers)
                    finally:
                        self.in_flight[url] -= 1
                    if problem:
                        self.failures.append(f"{url}: {problem}")
                    else:
                        self.completed += 1
                    await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)

    async def switch(self, url: str) -> None:
        """Point the balancer at ``url``, then wait until nothing is in flight elsewhere."""
        self.url = url
        await eventually(
            lambda: not any(count for other, count in self.in_flight.items() if other != url),
            None,
            every=0.05,
        )

    async def more(self, count: int) -> None:
        target = self.completed + count
        await eventually(lambda: self.completed >= target, None, every=0.05)


@pytest.mark.slow
@pytest.mark.deadline(420)
async def test_a_fleet_upgrades_one_process_at_a_time_with_no_failed_request(
    tmp_path, pg_url, agent_dir
):
    """Two controllers on one PostgreSQL and two nodes, all of the previous release
    (before protocol versions: "absent" is 1.0); then each controller, then each agent,
    replaced by this release, one process at a time, while clients stream through the
    controller the balancer points at. The one replica moves off a node before its
    agent is upgraded (docs/operations.md, "Upgrading a fleet")."""
    with trio.fail_after(170):
        old = await trio.to_thread.run_sync(_previous_release, tmp_path / "previous")
    new = Path(sys.executable)
    data = tmp_path / "data"
    ports = {"ctl-a": _free_port(), "ctl-b": _free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    def controller(name: str, python: Path) -> _Controller:
        env = controller_env(data, pg_url, name, **UPGRADE_TEMPO)
        return _Controller(env, tmp_path / f"{name}.log", python, ports[name], tmp_path)

    def executor(node: str, python: Path, credential: str) -> _Executor:
        folder = agent_dir / node
        folder.mkdir(exist_ok=True)
        log = tmp_path / f"{node}.log"
        return _Executor(python, list(urls.values()), credential, folder, settings, log, tmp_path)

    controllers = {name: controller(name, old) for name in ports}
    executors: dict[str, _Executor] = {}
    settings = write_agent_settings(tmp_path)
    try:
        with trio.fail_after(240):
            await controllers["ctl-a"].start()
            token = first_run_secrets(data / "first-run-secrets")["admin token"]
            await controllers["ctl-b"].start()
            env = controllers["ctl-a"].env
            credentials = {}
            for node in ("gpu-1", "gpu-2"):
                credentials[node] = await trio.to_thread.run_sync(add_node, env, node)
                executors[node] = executor(node, old, credentials[node])
            async with httpx.AsyncClient(timeout=60) as http:
                apis = {name: Api(url, token, http) for name, url in urls.items()}
                api = apis["ctl-a"]
                nodes = {name: await _node_connected(api, name) for name in ("gpu-1", "gpu-2")}
                _, service_id, _, key = await _serve_smol(api, nodes["gpu-1"], 900)
                for url in urls.values():
                    await _routed(http, url, service_id, key)  # the balancer's health check
                traffic = _Traffic(urls["ctl-b"], service_id, key)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(traffic.run)
                    await traffic.more(4)

                    # Controllers first, each out of the balancer while it is replaced.
                    for name, other in (("ctl-a", "ctl-b"), ("ctl-b", "ctl-a")):
                        await traffic.switch(urls[other])
                        controllers[name].stop()
                        controllers[name] = controller(name, new)
                        await controllers[name].start()
                        await _routed(http, urls[name], service_id, key)
                        await traffic.more(4)
                    await traffic.switch(urls["ctl-a"])
                    assert not traffic.failures, traffic.failures[:3]

                    # Then agents: gpu-2 (no replica), the replica moved onto it, gpu-1.
                    for name in ("gpu-2", "gpu-1"):
                        if name == "gpu-1":
                            await _move(apis, service_id, nodes["gpu-2"]["id"])
                            await traffic.more(4)
                        executors[name].stop()
                        started = time.time()
                        executors[name] = executor(name, new, credentials[name])
                        await api.until(
                            "GET",
                            f"/api/v1/contributors/{name}",
                            lambda n, since=started: (
                                n["state"] == "connected" and (n["last_heartbeat"] or 0) > since
                            ),
                        )
                        await traffic.more(4)
                    traffic.stop.set()
                print(
                    f"\nupgrade: {traffic.completed} streams answered, "
                    f"{len(traffic.failures)} failed"
                )
                assert traffic.failures == [], traffic.failures[:3]
                view = await api.ok("GET", f"/api/v1/inference/{service_id}")
                assert view["state"] == "ready"
                # Every process is of this release now, and speaks 1.1 with the others.
                for name in ("gpu-1", "gpu-2"):
                    log = (tmp_path / f"{name}.log").read_text(errors="replace")
                    assert "protocol_version_unsupported" not in log
                    welcomed = rf"welcomed node {name} as \w+ \(term \d+, protocol 1.1\)"
                    assert re.search(welcomed, log), log[-2000:]
    finally:
        for running in executors.values():
            running.stop()
        for running in controllers.values():
            running.stop()


async def _move(apis: dict[str, Api], service_id: str, target: str) -> None:
    """Move replica 0 to ``target`` through the leader; wait until it serves there."""
    leader = (await apis["ctl-a"].leader())["leader"]["id"]
    api = apis[leader]
    view = await api.ok("GET", f"/api/v1/inference/{service_id}")
    body = {"target_node_id": target, "revision": view["revision"]}
    await api.ok("POST", f"/api/v1/inference/{service_id}/replicas/0/move", json=body)
    await api.until(
        "GET",
        f"/api/v1/inference/{service_id}",
        lambda v: v["state"] == "ready" and v["replicas"][0].get("node_id") == target,
    )
