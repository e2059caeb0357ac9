"""The inference repository: records written read back whole, states as their enums."""

from __future__ import annotations

import attrs

from ficc_core.inference import repository
from ficc_core.inference.placement import Reservation
from ficc_core.inference.records import (
    AttemptRecord,
    AttemptState,
    Desired,
    ServiceRecord,
    ServiceState,
    UsageEntry,
)


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
    def entry(credential_id: str, finished_at: float, outcome: str = "ok") -> UsageEntry:
        return UsageEntry(
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
    await service.store.write(lambda tx: repository.insert_usage(tx, entries))
    summary = await service.store.read(lambda tx: repository.usage_summary(tx, "svc_a", 2.0, 1))
    assert (summary.totals.requests, summary.totals.errors) == (2, 1)
    assert (summary.totals.prompt_tokens, summary.totals.completion_tokens) == (6, 10)
    assert [(c.credential_id, c.requests) for c in summary.by_credential] == [("cred_a", 2)]
    assert summary.recent == (entries[2],)
