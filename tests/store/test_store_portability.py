"""Repository statements that read differently on SQLite and PostgreSQL unless written
portably, each on both backends: a parameter as a CASE condition, a mean over no
requests (a division by zero), and the order of a NULL group."""

from __future__ import annotations

import attrs

from ficc_core.inference import repository
from ficc_core.usage import repository as usage_repository
from ficc_core.usage.records import UsageRecord
from ficc_core.usage.report import UsageQuery, usage_report

from ..inference.test_inference_repository import _service


def _usage(replica: str, user_id: str | None, finished_at: float) -> UsageRecord:
    return UsageRecord(
        service_id="svc_a",
        generation=1,
        replica=replica,
        node_id="gpu-1",
        credential_id="cred",
        path="/v1/chat/completions",
        status=200 if replica else 429,
        outcome="ok" if replica else "rate_limited",
        prompt_tokens=3,
        completion_tokens=5,
        queue_wait=0.0,
        ttfb=None,
        duration=0.5,
        finished_at=finished_at,
        user_id=user_id,
    )


async def _with_project(store) -> str:
    await store.write(
        lambda tx: tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('p', 'p', 0)")
    )
    return "p"


async def test_set_scale_records_the_decision_only_when_asked(store_backend):
    project = await _with_project(store_backend)
    await store_backend.write(lambda tx: repository.insert_service(tx, _service(project)))
    await store_backend.write(
        lambda tx: repository.set_scale(tx, "svc_a", (0,), 5.0, decided=True, bump=False)
    )
    await store_backend.write(
        lambda tx: repository.set_scale(tx, "svc_a", (0, 1), 9.0, decided=False)
    )
    record = await store_backend.read(lambda tx: repository.service(tx, "svc_a"))
    assert (record.active, record.scaled_at, record.revision) == ((0, 1), 5.0, 2)


async def test_means_over_no_request_that_reached_a_replica_are_none(store_backend):
    project = await _with_project(store_backend)
    await store_backend.write(lambda tx: repository.insert_service(tx, _service(project)))
    refused = [_usage("", None, 1.0), _usage("", None, 2.0)]  # refusals reach no replica
    await store_backend.write(lambda tx: usage_repository.insert_usage(tx, refused))
    summary = await store_backend.read(
        lambda tx: usage_repository.usage_summary(tx, "svc_a", None, 5)
    )
    assert (summary.totals.requests, summary.totals.errors) == (2, 2)
    assert summary.totals.mean_ttfb is None and summary.totals.mean_duration is None


async def test_usage_groups_come_in_one_order_with_the_null_group_first(store_backend):
    entries = [_usage("r0", "u2", 1.0), _usage("r0", None, 2.0), _usage("r0", "u1", 3.0)]
    await store_backend.write(lambda tx: usage_repository.insert_usage(tx, entries))
    report = await store_backend.read(lambda tx: usage_report(tx, UsageQuery(group_by=("person",))))
    assert [group.key["person"]["id"] for group in report.groups] == [None, "u1", "u2"]
    assert [group.requests for group in report.groups] == [1, 1, 1]
    assert type(report.totals.requests) is int and report.totals.requests == 3
    assert attrs.asdict(report.totals)["cost"] == 0
