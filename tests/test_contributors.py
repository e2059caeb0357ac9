"""Contributor nodes: registration, node credentials, heartbeat states and the API."""

from __future__ import annotations

import json

import pytest
import trio
from click.testing import CliRunner

from ficc_core.cli.main import cli
from ficc_core.contributors import ConnectionFenced, NodeRegistry
from ficc_core.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from ficc_core.schema import ExecutorSnapshot, NodeResources, ProviderInfo

from .conftest import bearer, issue_token

DIGEST = "sha256:" + "ab" * 32


def _snapshot(node_id: str) -> ExecutorSnapshot:
    return ExecutorSnapshot(
        node_id=node_id,
        providers=[ProviderInfo(name="process", package_digest=DIGEST)],
        resources=NodeResources(cpus=4, memory_bytes=8 << 30, disk_free_bytes=100 << 30),
        endpoint_version=1,
    )


def _attempt(attempt_id: str, state: str = "ready") -> dict:
    return {
        "attempt_id": attempt_id,
        "generation": 1,
        "plan_digest": DIGEST,
        "provider": "process",
        "state": state,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def nodes(service, clock) -> NodeRegistry:
    return NodeRegistry(service.store, unreachable_after=10, lost_after=30, clock=clock)


async def test_a_node_credential_authenticates_as_its_node_only(nodes):
    with trio.fail_after(10):
        record, token = await nodes.add_node("gpu-1")
        await nodes.add_node("gpu-2")
        assert record.state == "registered"
        assert await nodes.authenticate(token) == "gpu-1"
        with pytest.raises(Unauthenticated):
            await nodes.authenticate(token[:-2] + "xx")


async def test_a_bearer_token_cannot_connect_as_a_node(service, nodes, bootstrap):
    with trio.fail_after(10), pytest.raises(Unauthenticated):
        await nodes.authenticate(bootstrap["token"])


async def test_a_node_name_is_registered_once_and_must_be_a_node_id(nodes):
    with trio.fail_after(10):
        await nodes.add_node("gpu-1")
        with pytest.raises(Conflict):
            await nodes.add_node("gpu-1")
        with pytest.raises(InvalidRequest):
            await nodes.add_node("no spaces")


async def test_heartbeats_make_a_node_connected_then_silence_unreachable_then_lost(nodes, clock):
    with trio.fail_after(10):
        await nodes.add_node("gpu-1")
        connection = await nodes.connect("gpu-1")
        view = await nodes.heartbeat(
            "gpu-1", connection, _snapshot("gpu-1"), [_attempt("a1"), _attempt("a2", "exited")]
        )
        assert view.state == "connected"
        assert view.last_heartbeat == clock.now
        assert view.snapshot["resources"]["cpus"] == 4
        clock.now += 9
        assert await nodes.sweep() == []
        clock.now += 1
        assert await nodes.sweep() == [("gpu-1", "unreachable")]
        assert (await nodes.get("gpu-1")).attempts[0].state == "ready"
        clock.now += 20
        assert await nodes.sweep() == [("gpu-1", "lost")]
        view = await nodes.get("gpu-1")
        assert view.state == "lost"
        assert {a.attempt_id: a.state for a in view.attempts} == {
            "a1": "unknown",
            "a2": "exited",
        }
        # Heard again: connected, with what it reports now.
        await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"), [])
        assert (await nodes.get("gpu-1")).state == "connected"


async def test_a_newer_connection_fences_out_the_older_one(nodes):
    with trio.fail_after(10):
        await nodes.add_node("gpu-1")
        older_scope = trio.CancelScope()
        older = await nodes.connect("gpu-1", older_scope)
        newer = await nodes.connect("gpu-1", trio.CancelScope())
        assert older_scope.cancel_called
        with pytest.raises(ConnectionFenced):
            await nodes.heartbeat("gpu-1", older, _snapshot("gpu-1"))
        await nodes.heartbeat("gpu-1", newer, _snapshot("gpu-1"))


async def test_a_snapshot_for_another_node_is_refused(nodes):
    with trio.fail_after(10):
        await nodes.add_node("gpu-1")
        connection = await nodes.connect("gpu-1")
        with pytest.raises(InvalidRequest):
            await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-2"))


async def test_a_revoked_node_cannot_authenticate_connect_or_heartbeat(nodes):
    with trio.fail_after(10):
        _, token = await nodes.add_node("gpu-1")
        connection = await nodes.connect("gpu-1")
        await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"), [_attempt("a1")])
        revoked = await nodes.revoke_node("gpu-1")
        assert revoked.state == "revoked"
        assert revoked.attempts[0].state == "unknown"
        with pytest.raises(Unauthenticated):
            await nodes.authenticate(token)
        with pytest.raises(Unauthenticated):
            await nodes.connect("gpu-1")
        with pytest.raises(Unauthenticated):
            await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"))
        with pytest.raises(NotFound):
            await nodes.revoke_node("nope")


# -- the API ----------------------------------------------------------------------------------


async def test_contributors_are_listed_with_state_heartbeat_snapshot_and_attempts(
    service, client, bootstrap
):
    with trio.fail_after(10):
        await service.contributors.add_node("gpu-1")
        connection = await service.contributors.connect("gpu-1")
        await service.contributors.heartbeat(
            "gpu-1", connection, _snapshot("gpu-1"), [_attempt("a1")]
        )
        token = await issue_token(service, scopes={"contributors:read"})
        response = await client.get("/api/v1/contributors", headers=bearer(token))
        assert response.status_code == 200
        (node,) = (await response.get_json())["contributors"]
        assert node["id"] == "gpu-1"
        assert node["state"] == "connected"
        assert node["snapshot"]["endpoint_version"] == 1
        assert node["attempts"][0]["attempt_id"] == "a1"
        assert "secret_hash" not in node
        one = await client.get("/api/v1/contributors/gpu-1", headers=bearer(token))
        assert (await one.get_json())["id"] == "gpu-1"
        missing = await client.get("/api/v1/contributors/nope", headers=bearer(token))
        assert missing.status_code == 404
        assert (await missing.get_json())["error"]["code"] == "node_not_found"


async def test_a_node_credential_is_refused_on_management_routes(service, client, bootstrap):
    with trio.fail_after(10):
        _, token = await service.contributors.add_node("gpu-1")
        for path in ("/api/v1/contributors", "/api/v1/whoami", "/api/v1/models"):
            response = await client.get(path, headers=bearer(token))
            assert response.status_code == 403, path
            assert (await response.get_json())["error"]["code"] == "node_credential_refused"


# -- the CLI ------------------------------------------------------------------------------------


def test_admin_add_node_prints_a_credential_once_and_revoke_node_revokes_it(tmp_path):
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, ["--data-dir", str(tmp_path / "data"), *args], env={})

    added = invoke("admin", "add-node", "gpu-1", "--label", "zone=a")
    assert added.exit_code == 0, added.output
    assert "node credential (shown once): ficcnode_" in added.output
    assert invoke("admin", "add-node", "gpu-1").exit_code != 0
    listed = invoke("admin", "list-nodes")
    (node,) = json.loads(listed.output)
    assert (node["id"], node["labels"], node["state"]) == ("gpu-1", {"zone": "a"}, "registered")
    revoked = invoke("admin", "revoke-node", "gpu-1")
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(revoked.output)["state"] == "revoked"
    assert invoke("admin", "add-node", "bad name").exit_code != 0


async def test_a_node_without_endpoint_version_1_is_refused_for_inference_only(nodes):
    await nodes.add_node("old-1")
    await nodes.add_node("new-1")
    old = await nodes.connect("old-1")
    new = await nodes.connect("new-1")
    legacy = ExecutorSnapshot(
        node_id="old-1",
        providers=[ProviderInfo(name="process", package_digest=DIGEST)],
        resources=NodeResources(cpus=4, memory_bytes=8 << 30, disk_free_bytes=100 << 30),
    )
    await nodes.heartbeat("old-1", old, legacy, [_attempt("running-job")])
    await nodes.heartbeat("new-1", new, _snapshot("new-1"))
    refusal = await nodes.inference_refusal("old-1")
    assert refusal["code"] == "endpoint_version_unsupported"
    assert "old-1" in refusal["message"] and "endpoint_version None" in refusal["message"]
    assert await nodes.inference_refusal("new-1") is None
    # Everything else the old node does keeps working: it is connected and its
    # reported attempts stand.
    view = await nodes.get("old-1")
    assert view.state == "connected"
    assert [a.attempt_id for a in view.attempts] == ["running-job"]
    assert (await nodes.heartbeat("old-1", old, legacy, [])).state == "connected"
