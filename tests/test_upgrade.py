"""Rolling upgrades: the node protocol's version and its negotiation, against a real
controller (docs/agents.md, "Protocol versions"; docs/operations.md, "Upgrading a fleet")."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from ficc_core.agent import Agent
from ficc_core.agent.remote import RemoteAgent, websocket_url
from ficc_core.nodelink.wire import PROTOCOL_HEADER
from ficc_core.schema import GpuDevice, unstructure

from .agent_support import open_controller


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fu-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _no_gpus() -> tuple[GpuDevice, ...]:
    return ()


def _agent(agent_dir: Path, node_id: str) -> Agent:
    from ficc_executor_process.provider import ProcessProvider

    return Agent(
        node_id=node_id,
        providers={"process": ProcessProvider(state_dir=agent_dir / "p", default_grace=1.0)},
        state_dir=agent_dir,
        gpu_query=_no_gpus,
        stop_grace=1.0,
    )


async def _snapshot_document(agent_dir: Path) -> dict:
    agent = _agent(agent_dir, "gpu-1")
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
            remote = RemoteAgent(url, token, lambda named: _agent(agent_dir, named))
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


async def test_a_refused_agent_says_what_to_upgrade_and_keeps_dialling(
    tmp_path, agent_dir, monkeypatch, caplog
):
    import ficc_core.agent.remote as remote_module

    caplog.set_level(logging.INFO, logger="ficc.agent")
    monkeypatch.setattr(remote_module, "PROTOCOL_VERSION", "1.3")
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            remote = RemoteAgent(
                url, token, lambda named: _agent(agent_dir, named), backoff_initial=0.05
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(remote.run)
                [link] = remote.links
                while caplog.text.count("protocol_version_unsupported") < 2:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                assert "upgrade the controller" in caplog.text
                assert not link.connected and link.sessions == 0
                # The operator upgrades the controller (here: the agent comes back to a
                # version it accepts): the next dial is welcomed.
                monkeypatch.setattr(remote_module, "PROTOCOL_VERSION", "1.1")
                await _connected(service, "gpu-1")
                nursery.cancel_scope.cancel()
