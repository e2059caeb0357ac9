"""The usage ledger over the real SQLite store: batches, failed writes, aggregation, drops.

The store is wrapped only to count writes or make them fail (the edge an unwritable
database is); what is written is read back from SQLite.
"""

from __future__ import annotations

import logging
import sqlite3

import trio

from ficc_core.controller.metrics import Metrics
from ficc_core.usage import UsageLedger, UsageRecord

from ..support.waiting import eventually


class WriteGate:
    """The real store; ``fail`` makes writes raise (a read-only or full disk), counted;
    ``allow``: that many more writes succeed, then ``fail`` is set."""

    def __init__(self, store) -> None:
        self.store, self.writes, self.failed = store, 0, 0
        self.fail = False
        self.allow: int | None = None

    async def read(self, fn):
        return await self.store.read(fn)

    async def write(self, fn):
        if self.allow is not None:
            self.fail, self.allow = self.allow <= 0, self.allow - 1
        if self.fail:
            self.failed += 1
            raise sqlite3.OperationalError("attempt to write a readonly database")
        self.writes += 1
        return await self.store.write(fn)


def usage(n: int = 0, **fields) -> UsageRecord:
    values = dict(
        service_id="svc",
        generation=1,
        replica="r1",
        node_id="local",
        credential_id="cred-a",
        credential_kind="credential",
        path="/v1/chat/completions",
        status=200,
        outcome="ok",
        prompt_tokens=10,
        completion_tokens=n,
        queue_wait=0.0,
        ttfb=0.1,
        duration=0.5,
        finished_at=1_700_000_000.0 + n,
        project_id="p1",
        user_id="u1",
        model="m1",
        cost=7,
    )
    values.update(fields)
    return UsageRecord(**values)


async def rows(store) -> list[dict]:
    return await store.read(
        lambda tx: tx.fetch_all(
            "SELECT replica, credential_id, outcome, requests, prompt_tokens,"
            " completion_tokens, cost, project_id, user_id, model FROM inference_usage ORDER BY id"
        )
    )


def metric(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


async def test_a_flush_writes_a_batch_per_transaction(service):
    gate = WriteGate(service.store)
    ledger = UsageLedger(gate, batch_size=3)
    for n in range(7):
        ledger.record(usage(n))
    assert await ledger.flush() == 7
    assert gate.writes == 3
    written = await rows(service.store)
    assert [r["completion_tokens"] for r in written] == list(range(7))
    assert written[0] | {"completion_tokens": 0} == {
        "replica": "r1",
        "credential_id": "cred-a",
        "outcome": "ok",
        "requests": 1,
        "prompt_tokens": 10,
        "completion_tokens": 0,
        "cost": 7,
        "project_id": "p1",
        "user_id": "u1",
        "model": "m1",
    }


async def test_a_full_batch_wakes_the_writer_before_its_interval(service):
    gate = WriteGate(service.store)
    ledger = UsageLedger(gate, period=3600, batch_size=4)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for n in range(3):
                ledger.record(usage(n))
            await trio.sleep(0.2)
            assert gate.writes == 0, "less than a batch waits for the interval"
            ledger.record(usage(3))
            await eventually(lambda: gate.writes != 0, None, every=0.01)
            nursery.cancel_scope.cancel()
    assert len(await rows(service.store)) == 4


async def test_a_failed_write_keeps_its_records_and_the_writer_runs_on(service, caplog):
    gate = WriteGate(service.store)
    metrics = Metrics()
    ledger = UsageLedger(gate, period=0.01, batch_size=2, metrics=metrics)
    gate.fail = True
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for n in range(5):
                ledger.record(usage(n))
            await eventually(lambda: gate.failed >= 3, None, every=0.01)
            assert ledger.buffered == 5
            assert metric(metrics, "ficc_usage_write_failures_total") >= 3
            gate.fail = False
            await eventually(lambda: not ledger.buffered, None, every=0.01)
            nursery.cancel_scope.cancel()
    assert [r["completion_tokens"] for r in await rows(service.store)] == list(range(5))
    assert ledger.failures == 0
    assert metric(metrics, "ficc_usage_buffered_records") == 0
    assert any("cannot write usage records" in r.message for r in caplog.records)


async def test_beyond_the_buffer_records_are_aggregated_then_dropped_and_counted(service, caplog):
    metrics = Metrics()
    gate = WriteGate(service.store)
    ledger = UsageLedger(gate, batch_size=100, capacity=3, metrics=metrics)
    caplog.set_level(logging.WARNING, "ficc.inference.usage")
    for n in range(3):  # the buffer
        ledger.record(usage(n))
    # Beyond it: per credential and outcome (same minute), three summary rows at most.
    for n in range(10):
        ledger.record(usage(n, credential_id="cred-a"))
    for n in range(4):
        ledger.record(usage(n, credential_id="cred-b", outcome="rate_limited", status=429))
    ledger.record(usage(0, credential_id="cred-c"))
    ledger.record(usage(0, credential_id="cred-d"))  # a fourth key: dropped
    ledger.record(usage(1, credential_id="cred-d"))
    assert (ledger.aggregated, ledger.dropped) == (15, 2)
    assert metric(metrics, "ficc_usage_aggregated_total") == 15
    assert metric(metrics, "ficc_usage_dropped_total") == 2
    warnings = [r for r in caplog.records if "usage buffer is full" in r.message]
    assert len(warnings) == 1, "logged once a minute, not per record"
    assert await ledger.flush() == 3 + 15
    written = await rows(service.store)
    assert len(written) == 6
    summaries = {r["credential_id"]: r for r in written[3:]}
    assert summaries["cred-a"] | {"user_id": None} == {
        "replica": "r1",
        "credential_id": "cred-a",
        "outcome": "ok",
        "requests": 10,
        "prompt_tokens": 100,
        "completion_tokens": sum(range(10)),
        "cost": 70,
        "project_id": "p1",
        "user_id": None,
        "model": "m1",
    }
    assert (summaries["cred-b"]["requests"], summaries["cred-b"]["outcome"]) == (4, "rate_limited")
    # Totals stay right: every request but the two dropped is counted.
    total = await service.store.read(
        lambda tx: tx.fetch_one("SELECT SUM(requests) AS n, SUM(cost) AS c FROM inference_usage")
    )
    assert total == {"n": 18, "c": 18 * 7}


async def test_summary_rows_not_written_are_kept_with_what_was_folded_meanwhile(service):
    gate = WriteGate(service.store)
    ledger = UsageLedger(gate, capacity=1)
    ledger.record(usage(0))
    ledger.record(usage(1))  # folded
    gate.allow = 1  # the record's batch is written, the summary rows' write fails
    try:
        await ledger.flush()
    except sqlite3.OperationalError:
        pass
    else:
        raise AssertionError("the summary rows' write did not fail")
    ledger.record(usage(2))  # the buffer has room again
    ledger.record(usage(3))  # full again: folded into the row that was not written
    gate.allow, gate.fail = None, False
    assert await ledger.flush() == 3
    written = await rows(service.store)
    assert [(r["requests"], r["completion_tokens"]) for r in written] == [(1, 0), (1, 2), (2, 4)]
