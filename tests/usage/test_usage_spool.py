"""The usage spool over each real store: records a killed controller held in memory are on
disk, and the next start writes them once (docs/usage.md, "Accounting").

A "kill" here is the spool's files left as a SIGKILL leaves them: the segment not
deleted, the lock released (the kernel does that for a dead process) and nothing
flushed; tests/usage/test_usage_spool_e2e.py SIGKILLs a real ``ficc serve``.
"""

from __future__ import annotations

import time

import pytest
import trio

from ficc_core.usage import UsageLedger, UsageSpool

from ..support.waiting import eventually
from .test_usage_ledger import WriteGate, usage


async def _rows(store) -> list[dict]:
    return await store.read(
        lambda tx: tx.fetch_all(
            "SELECT completion_tokens, record_id, requests FROM inference_usage"
            " ORDER BY completion_tokens"
        )
    )


async def _spooled(store, folder, owner="ctl-1") -> UsageLedger:
    spool = UsageSpool(folder, owner)
    await trio.to_thread.run_sync(spool.open)
    return UsageLedger(store, period=3600, batch_size=2, spool=spool)


def _killed(ledger: UsageLedger) -> None:
    """What a SIGKILL leaves: the files as they are, the lock released."""
    ledger.spool.close(remove=False)


@pytest.mark.deadline(40)
async def test_records_a_killed_controller_held_are_replayed_once_at_the_next_start(
    store_backend, tmp_path
):
    folder = tmp_path / "usage-spool"
    with trio.fail_after(30):
        first = await _spooled(store_backend, folder)
        for n in range(3):
            first.record(usage(n))
        await first.flush()  # these are stored and their segment deleted
        for n in range(3, 8):
            first.record(usage(n))
        assert first.buffered == 5
        # Stored, but killed before the segment went: replayed, skipped by record_id.
        gate = WriteGate(store_backend)
        gate.allow = 2  # the sealed segment stays: the third batch write fails
        first.store = gate
        await first._try_flush()
        assert first.failures == 1 and first.buffered == 1
        _killed(first)
        assert [row["completion_tokens"] for row in await _rows(store_backend)] == [
            0, 1, 2, 3, 4, 5, 6,
        ]  # fmt: skip

        second = await _spooled(store_backend, folder, owner="ctl-1")
        assert await second.replay() == 5
        rows = await _rows(store_backend)
        assert [row["completion_tokens"] for row in rows] == list(range(8))
        assert all(row["requests"] == 1 for row in rows)
        assert len({row["record_id"] for row in rows}) == 8
        assert all(row["record_id"].startswith("ctl-1.") for row in rows)
        # The replayed spool is gone; a second start has nothing left to replay.
        assert sorted(p.name for p in folder.iterdir() if first.spool.name in p.name) == []
        third = await _spooled(store_backend, folder, owner="ctl-1")
        assert await third.replay() == 0
        assert len(await _rows(store_backend)) == 8


@pytest.mark.deadline(40)
async def test_a_running_controller_s_spool_is_not_replayed_and_a_cut_line_is_skipped(
    store_backend, tmp_path
):
    folder = tmp_path / "usage-spool"
    with trio.fail_after(30):
        running = await _spooled(store_backend, folder, owner="ctl-a")
        running.record(usage(1))
        killed = await _spooled(store_backend, folder, owner="ctl-b")
        killed.record(usage(2))
        killed.record(usage(3))
        _killed(killed)
        [segment] = folder.glob(f"{killed.spool.name}.*.spool")
        whole = segment.read_bytes()
        with segment.open("ab") as cut:  # the kill came in the middle of a write
            cut.write(whole[: len(whole) // 4])

        starting = await _spooled(store_backend, folder, owner="ctl-c")
        assert await starting.replay() == 2
        assert [row["completion_tokens"] for row in await _rows(store_backend)] == [2, 3]
        assert list(folder.glob(f"{running.spool.name}.*")) != []  # ctl-a's is its own
        await running.flush()
        assert [row["completion_tokens"] for row in await _rows(store_backend)] == [1, 2, 3]


@pytest.mark.deadline(40)
async def test_a_clean_stop_leaves_no_spool_and_the_spool_moves_on_at_each_write(
    store_backend, tmp_path
):
    folder = tmp_path / "usage-spool"
    with trio.fail_after(30):
        ledger = await _spooled(store_backend, folder)
        ledger.period = 0.05
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for n in range(4):
                ledger.record(usage(n))
            await eventually(
                lambda: not ledger.buffered and len(list(folder.glob("*.spool"))) <= 1,
                None,
                every=0.01,
            )
            # Written: only the segment the next records go to is left, empty.
            [segment] = folder.glob("*.spool")
            assert segment.stat().st_size == 0
            ledger.record(usage(4))
            assert segment.stat().st_size > 0  # on disk before any write to the store
            nursery.cancel_scope.cancel()
        assert list(folder.iterdir()) == []
        assert len(await _rows(store_backend)) == 5


def test_appending_a_record_to_the_spool_costs_microseconds(tmp_path):
    """The request path's share: one pickle of plain values and one os.write per record."""
    spool = UsageSpool(tmp_path, "ctl-1")
    spool.open()
    ledger = UsageLedger(None, capacity=1_000_000, spool=spool)  # type: ignore[arg-type]
    records = [usage(n) for n in range(2000)]
    started = time.perf_counter()
    for record in records:
        ledger.record(record)
    each = (time.perf_counter() - started) / len(records)
    spool.close(remove=True)
    assert each < 200e-6, f"{each * 1e6:.1f} µs per record"
