"""Contributor nodes: registration, node credentials, heartbeat states and the API."""

from __future__ import annotations

import json

import pytest
import trio
from click.testing import CliRunner

from ficc_core.base.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from ficc_core.cli.main import cli
from ficc_core.contributors import ConnectionFenced, NodeRegistry
from ficc_core.schema import ExecutorSnapshot, NodeResources, ProviderInfo

from ..conftest import bearer, issue_token
from ..support.clock import FakeClock
from ..support.serve_support import make_data_dir

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


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


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
    make_data_dir(tmp_path / "data")
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, ["--data-dir", str(tmp_path / "data"), *args], env={})

    added = invoke("admin", "add-node", "gpu-1", "--label", "zone=a")
    assert added.exit_code == 0, added.output
    assert "node credential (shown once): ficcnode_" in added.output
    assert invoke("admin", "add-node", "gpu-1").exit_code != 0
    listed = invoke("admin", "list-nodes", "--json")
    (node,) = json.loads(listed.output)
    assert (node["id"], node["labels"], node["state"]) == ("gpu-1", {"zone": "a"}, "registered")
    revoked = invoke("admin", "revoke-node", "gpu-1", "--json")
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


# -- records, views and the repository ----------------------------------------------------------


async def test_a_node_is_shown_as_the_api_always_showed_it(
    service, client, bootstrap, nodes, clock
):
    # Pinned bytes: the view moved to api/ without changing a key, a type or an order.
    record, _ = await nodes.add_node("gpu-1", labels={"zone": "a", "rack": "3"})
    connection = await nodes.connect("gpu-1")
    clock.now += 5
    await nodes.heartbeat(
        "gpu-1", connection, _snapshot("gpu-1"), [_attempt("b2"), _attempt("a1", "exited")]
    )
    token = await issue_token(service, scopes={"contributors:read"})
    response = await client.get("/api/v1/contributors/gpu-1", headers=bearer(token))
    digest = DIGEST.removeprefix("sha256:")
    attempt = (
        '{{"attempt_id":"{}","generation":1,"plan_digest":"sha256:' + digest + '",'
        '"provider":"process","state":"{}","updated_at":1005.0}}'
    )
    assert (await response.get_data(as_text=True)) == (
        '{"attempts":['
        + attempt.format("a1", "exited")
        + ","
        + attempt.format("b2", "ready")
        + '],"created_at":1000.0,"credential_id":"'
        + record.credential_id
        + '","id":"gpu-1","labels":{"rack":"3","zone":"a"},"last_heartbeat":1005.0,'
        '"name":"gpu-1","reservations":[],"revoked_at":null,"snapshot":{"endpoint_version":1,'
        '"labels":{},"node_id":"gpu-1","providers":[{"name":"process","package_digest":"sha256:'
        + digest
        + '"}],"resources":{"cpus":4.0,"disk_free_bytes":107374182400,"gpus":[],'
        '"memory_bytes":8589934592},"runtimes":[]},"state":"connected"}\n'
    )


def test_a_node_view_shows_each_reservation_with_its_gpu_shares():
    from ficc_core.api.views_contributors import node_view
    from ficc_core.contributors import GpuShare, Node, NodeReservation, NodeState

    node = Node(
        id="gpu-1",
        name="gpu-1",
        state=NodeState.UNREACHABLE,
        labels={},
        credential_id="c1",
        connection_id="secret-to-the-view",
        last_heartbeat=2.0,
        snapshot=None,
        created_at=1.0,
        revoked_at=None,
        reservations=(
            NodeReservation(
                service_id="svc_1",
                replica=0,
                cpus=1.5,
                memory_bytes=10,
                disk_bytes=20,
                gpus=(GpuShare(0, 30), GpuShare(1, 40)),
            ),
        ),
    )
    view = node_view(node)
    assert json.dumps(view, sort_keys=True) == json.dumps(
        {
            "attempts": [],
            "created_at": 1.0,
            "credential_id": "c1",
            "id": "gpu-1",
            "labels": {},
            "last_heartbeat": 2.0,
            "name": "gpu-1",
            "reservations": [
                {
                    "cpus": 1.5,
                    "disk_bytes": 20,
                    "gpus": [{"index": 0, "memory_bytes": 30}, {"index": 1, "memory_bytes": 40}],
                    "memory_bytes": 10,
                    "replica": 0,
                    "service_id": "svc_1",
                }
            ],
            "revoked_at": None,
            "snapshot": None,
            "state": "unreachable",
        },
        sort_keys=True,
    )
    assert "connection_id" not in view


async def test_assigning_an_attempt_again_replaces_its_assignment(nodes):
    from ficc_core.schema import Fence

    await nodes.add_node("gpu-1")
    fence = Fence(attempt_id="a1", generation=1, plan_digest=DIGEST)
    await nodes.assign("gpu-1", fence, "process", inputs=["bb", "aa", "bb"])
    assert await nodes.give_up("gpu-1", "a1")
    (given_up,) = await nodes.assignments("gpu-1")
    assert (given_up.wanted, given_up.reason, given_up.inputs) == (False, "given_up", ("aa", "bb"))
    newer = Fence(attempt_id="a1", generation=2, plan_digest=DIGEST)
    await nodes.assign("gpu-1", newer, "container", inputs=["cc"])
    (again,) = await nodes.assignments("gpu-1")
    assert (again.fence, again.provider, again.wanted, again.reason, again.inputs) == (
        newer,
        "container",
        True,
        "launched",
        ("cc",),
    )
    assert await nodes.wanted_attempt_ids("gpu-1") == ["a1"]
    assert not await nodes.give_up("gpu-1", "never-assigned")


async def test_a_heartbeat_reporting_an_unknown_attempt_state_is_refused(nodes):
    await nodes.add_node("gpu-1")
    connection = await nodes.connect("gpu-1")
    with pytest.raises(InvalidRequest) as refused:
        await nodes.heartbeat("gpu-1", connection, _snapshot("gpu-1"), [_attempt("a1", "dancing")])
    assert refused.value.code == "bad_heartbeat"
    assert "dancing" in refused.value.message
    # Nothing of it was recorded: the node was never heard from.
    node = await nodes.get("gpu-1")
    assert (node.state, node.last_heartbeat, node.attempts) == ("registered", None, ())


async def test_a_sweep_moves_each_silent_node_once_a_long_silence_straight_to_lost(nodes, clock):
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        await nodes.add_node(name)
    gpu1, gpu2 = await nodes.connect("gpu-1"), await nodes.connect("gpu-2")
    await nodes.heartbeat("gpu-1", gpu1, _snapshot("gpu-1"), [_attempt("a1")])
    clock.now += 20
    await nodes.heartbeat("gpu-2", gpu2, _snapshot("gpu-2"))
    clock.now += 12  # gpu-1 silent 32 s (past lost_after), gpu-2 12 s; gpu-3 never heard
    assert await nodes.sweep() == [("gpu-1", "lost"), ("gpu-2", "unreachable")]
    clock.now += 5  # gpu-2 silent 17 s: still unreachable, not changed again
    assert await nodes.sweep() == []
    lost = await nodes.get("gpu-1")
    assert [a.state for a in lost.attempts] == ["unknown"]
    assert (await nodes.get("gpu-3")).state == "registered"


def test_contributor_sql_is_all_in_the_repository_and_portable():
    from pathlib import Path

    import ficc_core.contributors as package

    folder = Path(package.__file__).parent
    for module in folder.glob("*.py"):
        text = module.read_text()
        if module.name != "repository.py":
            for statement in ("SELECT ", "INSERT ", "UPDATE ", "DELETE "):
                assert statement not in text, (module.name, statement)
    repository = (folder / "repository.py").read_text().upper()
    for sqlite_only in ("INSERT OR", "JSON_EACH", "JSON_EXTRACT", "ROWID", "STRFTIME", "DATETIME("):
        assert sqlite_only not in repository, sqlite_only
