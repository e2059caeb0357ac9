"""The inference repository: records written read back whole, states as their enums."""

from __future__ import annotations

import attrs
import pytest

from ficc_core.contributors import repository as contributors
from ficc_core.contributors.records import Assignment, AssignmentReason, NodeState
from ficc_core.inference import repository
from ficc_core.inference.records import (
    AttemptRecord,
    AttemptState,
    Desired,
    PlacementNode,
    Reservation,
    ServiceRecord,
    ServiceState,
)
from ficc_core.schema import ExecutorSnapshot, NodeResources, ProviderInfo, canonical_json
from ficc_core.usage import repository as usage_repository
from ficc_core.usage.records import UsageRecord


@pytest.fixture
def config(backend_config):
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_config


async def _project_id(service) -> str:
    row = await service.store.read(lambda tx: tx.fetch_one("SELECT id FROM projects"))
    return row["id"]


def _service(project_id: str) -> ServiceRecord:
    return ServiceRecord(
        id="svc_a",
        project_id=project_id,
        alias="a",
        model_id="mdl_a",
        spec='{"alias":"a"}',
        revision=1,
        generation=0,
        desired=Desired.STOPPED,
        state=ServiceState.STOPPED,
        reason=None,
        plan_digest="sha256:" + "2" * 64,
        created_at=1.0,
        updated_at=1.0,
    )


def _attempt() -> AttemptRecord:
    return AttemptRecord(
        attempt_id="svc_a.r0.g1.a1.x",
        service_id="svc_a",
        replica=0,
        generation=1,
        number=1,
        node_id="gpu-1",
        provider="process",
        state=AttemptState.PENDING,
        created_at=2.0,
        updated_at=2.0,
    )


async def test_a_service_its_attempts_and_reservations_read_back_as_written(service, bootstrap):
    record = _service(await _project_id(service))
    attempt = _attempt()
    held = Reservation(
        service_id="svc_a", replica=0, node_id="gpu-1", cpus=2, memory_bytes=8, gpus=((1, 4),)
    )

    def write(tx) -> None:
        repository.insert_service(tx, record)
        repository.insert_attempt(tx, attempt)
        repository.insert_reservations(tx, [held], 2.0)

    await service.store.write(write)
    detail = await service.store.read(lambda tx: repository.detail(tx, "svc_a"))
    assert detail.service == record
    assert detail.attempts == (attempt,)
    assert detail.reservations == (held,)
    assert type(detail.service.state) is ServiceState
    assert type(detail.attempts[0].state) is AttemptState


async def test_a_dropped_reservation_passes_its_staged_disk_to_a_replica_left_on_the_node(
    service, bootstrap
):
    # A move of the replica that carried a node's staged copy left the other replica
    # there holding no disk for it: the node's disk was counted short.
    record = _service(await _project_id(service))
    size = 5 << 30

    def held(replica: int, node_id: str, disk: int, generation: int = 0) -> Reservation:
        return Reservation(
            service_id="svc_a", replica=replica, node_id=node_id, cpus=1, memory_bytes=8,
            disk_bytes=disk, generation=generation,
        )  # fmt: skip

    def write(tx) -> None:
        repository.insert_service(tx, record)
        repository.insert_reservations(
            tx,
            [held(0, "n2", size), held(1, "n3", size), held(2, "n2", 0), held(3, "n2", 0),
             held(0, "n2", size, generation=1)],
            2.0,
        )  # fmt: skip

    def disks(tx) -> list[tuple[tuple[int, int, str], int]]:
        return sorted((r.key, r.disk_bytes) for r in repository.reservations(tx, "svc_a"))

    await service.store.write(write)
    # Replica 0 of generation 0 leaves n2: replica 2, the lowest left there, carries it.
    dropped = (0, 0, "n2")
    await service.store.write(lambda tx: repository.delete_reservation_key(tx, "svc_a", dropped))
    assert await service.store.read(disks) == [
        ((0, 1, "n3"), size), ((0, 2, "n2"), size), ((0, 3, "n2"), 0), ((1, 0, "n2"), size),
    ]  # fmt: skip
    # Dropping a replica (each generation of it) passes its disk on the same way;
    # generation 1 keeps its own copy's disk.
    await service.store.write(lambda tx: repository.delete_reservation(tx, "svc_a", 2))
    assert await service.store.read(disks) == [
        ((0, 1, "n3"), size), ((0, 3, "n2"), size), ((1, 0, "n2"), size),
    ]  # fmt: skip
    # The last replica of a generation on its node takes the disk with it.
    await service.store.write(lambda tx: repository.delete_reservation(tx, "svc_a", 3))
    await service.store.write(lambda tx: repository.delete_reservation(tx, "svc_a", 1))
    assert await service.store.read(disks) == [((1, 0, "n2"), size)]


async def test_updates_write_every_changeable_field_and_move_the_revision(service, bootstrap):
    record = _service(await _project_id(service))
    attempt = _attempt()

    def write(tx) -> None:
        repository.insert_service(tx, record)
        repository.insert_attempt(tx, attempt)

    await service.store.write(write)
    started = attrs.evolve(
        record,
        generation=1,
        desired=Desired.DRAINING,
        state=ServiceState.DRAINING,
        reason="why",
        drain_deadline=9.5,
    )
    failed = attrs.evolve(
        attempt,
        state=AttemptState.FAILED,
        reason="launch_failed",
        message="no",
        plan_digest="sha256:" + "3" * 64,
        workload="{}",
        released=True,
    )

    def update(tx) -> None:
        repository.update_service(tx, started, 5.0)
        repository.update_attempt(tx, failed, 6.0)
        repository.bump(tx, "svc_a", 7.0)

    await service.store.write(update)
    detail = await service.store.read(lambda tx: repository.detail(tx, "svc_a"))
    assert detail.service == attrs.evolve(started, revision=3, updated_at=7.0)
    assert detail.attempts == (attrs.evolve(failed, updated_at=6.0),)
    assert [
        a.attempt_id
        for a in await service.store.read(lambda tx: repository.unreleased_attempts(tx, "svc_a"))
    ] == []


async def test_usage_is_summed_per_service_and_credential_with_the_latest_first(service):
    def entry(credential_id: str, finished_at: float, outcome: str = "ok") -> UsageRecord:
        return UsageRecord(
            service_id="svc_a",
            generation=1,
            replica="r0",
            node_id="gpu-1",
            credential_id=credential_id,
            path="/v1/chat/completions",
            status=200,
            outcome=outcome,
            prompt_tokens=3,
            completion_tokens=5,
            queue_wait=0.0,
            ttfb=0.1,
            duration=0.5,
            finished_at=finished_at,
        )

    entries = [entry("cred_b", 1.0), entry("cred_a", 2.0, "engine_error"), entry("cred_a", 3.0)]
    await service.store.write(lambda tx: usage_repository.insert_usage(tx, entries))
    summary = await service.store.read(
        lambda tx: usage_repository.usage_summary(tx, "svc_a", 2.0, 1)
    )
    assert (summary.totals.requests, summary.totals.errors) == (2, 1)
    assert (summary.totals.prompt_tokens, summary.totals.completion_tokens) == (6, 10)
    assert [(c.credential_id, c.requests) for c in summary.by_credential] == [("cred_a", 2)]
    assert summary.recent == (entries[2],)


# -- the contributors' tables, through their repository -----------------------------------------


def _node(tx, name: str, labels: dict[str, str] | None = None) -> None:
    contributors.insert_node(
        tx,
        name=name,
        labels=labels or {},
        credential_id=f"cred_{name}",
        secret_hash="hash",
        created_at=1.0,
    )


async def test_placement_sees_each_node_by_its_contributor_record(service):
    snapshot = ExecutorSnapshot(
        node_id="gpu-1",
        providers=[ProviderInfo(name="process", package_digest="sha256:" + "ab" * 32)],
        resources=NodeResources(cpus=4, memory_bytes=8 << 30, disk_free_bytes=100 << 30),
        endpoint_version=1,
    )

    def write(tx) -> None:
        _node(tx, "gpu-1")
        _node(tx, "edge-1", {"ficc/embedded": "true"})
        _node(tx, "old-1")
        encoded = canonical_json(snapshot).decode("utf-8")
        contributors.record_heartbeat(tx, "gpu-1", now=2.0, snapshot=encoded, attempts=[])
        # A snapshot this version no longer reads counts as none (the node is refused).
        contributors.record_heartbeat(tx, "old-1", now=2.0, snapshot='{"cpus":1}', attempts=[])
        contributors.set_state(tx, "old-1", NodeState.UNREACHABLE)

    await service.store.write(write)
    seen = await service.store.read(
        lambda tx: repository.placement_nodes(tx, ["gpu-1", "edge-1", "old-1", "gone-1"])
    )
    assert sorted(seen) == ["edge-1", "gpu-1", "old-1"]
    assert canonical_json(seen["gpu-1"].snapshot) == canonical_json(snapshot)
    assert attrs.evolve(seen["gpu-1"], snapshot=None) == PlacementNode(
        node_id="gpu-1", state=NodeState.CONNECTED, snapshot=None
    )
    assert seen["edge-1"] == PlacementNode(
        node_id="edge-1", state=NodeState.REGISTERED, snapshot=None, embedded=True
    )
    assert seen["old-1"] == PlacementNode(
        node_id="old-1", state=NodeState.UNREACHABLE, snapshot=None
    )
    assert all(type(node.state) is NodeState for node in seen.values())


async def test_giving_up_attempts_tells_their_nodes_even_where_a_loss_already_unwanted_them(
    service, bootstrap
):
    # An acknowledged unknown outcome replaces the "unknown" the node's loss wrote: the
    # assignment says the operator gave it up (unlike unwant, which leaves an unwanted one).
    record = _service(await _project_id(service))
    lost = attrs.evolve(_attempt(), attempt_id="lost", state=AttemptState.UNKNOWN)
    back = attrs.evolve(_attempt(), attempt_id="back", replica=1, state=AttemptState.UNKNOWN)
    done = attrs.evolve(
        _attempt(), attempt_id="done", replica=2, state=AttemptState.STOPPED, released=True
    )

    def assignment(attempt_id: str, wanted: bool, reason: AssignmentReason) -> Assignment:
        return Assignment(
            node_id="gpu-1",
            attempt_id=attempt_id,
            generation=1,
            plan_digest="sha256:" + "2" * 64,
            provider="process",
            wanted=wanted,
            reason=reason,
            updated_at=3.0,
        )

    def write(tx) -> None:
        repository.insert_service(tx, record)
        _node(tx, "gpu-1")
        for attempt in (lost, back, done):
            repository.insert_attempt(tx, attempt)
        contributors.put_assignment(tx, assignment("lost", False, AssignmentReason.UNKNOWN))
        contributors.put_assignment(tx, assignment("back", True, AssignmentReason.LAUNCHED))
        contributors.put_assignment(tx, assignment("done", False, AssignmentReason.STOPPED))

    await service.store.write(write)
    await service.store.write(
        lambda tx: repository.give_up_attempts(
            tx, "svc_a", AssignmentReason.ACKNOWLEDGED_UNKNOWN, 9.0
        )
    )
    assignments = await service.store.read(lambda tx: contributors.fetch_assignments(tx, "gpu-1"))
    assert {a.attempt_id: (a.wanted, a.reason, a.updated_at) for a in assignments} == {
        "lost": (False, AssignmentReason.ACKNOWLEDGED_UNKNOWN, 9.0),
        "back": (False, AssignmentReason.ACKNOWLEDGED_UNKNOWN, 9.0),
        "done": (False, AssignmentReason.STOPPED, 3.0),
    }
    attempts = await service.store.read(lambda tx: repository.attempts(tx, "svc_a"))
    assert {a.attempt_id: (a.released, a.reason) for a in attempts} == {
        "lost": (True, "acknowledged_unknown"),
        "back": (True, "acknowledged_unknown"),
        "done": (True, None),
    }
