"""Engine logs that outlive the agent: an ended attempt's log is kept on the node's disk
when its provider stops (or a new run clears what a killed one left), bounded in total
size and in age, and served by the next run, fenced as before."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import attrs
import pytest
import trio

from ficc_core.executor import StaleFence, UnknownAttempt
from ficc_core.executor.logs import KEPT_RECORD, KeptLogs
from ficc_core.schema import Fence
from ficc_core.testing.executor_kit import new_fence, standin_job
from ficc_core.testing.executor_support import exchange


@pytest.fixture
def state_dir():
    path = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _provider(state_dir: Path, **options):
    from ficc_executor_process.provider import ProcessProvider

    return ProcessProvider(state_dir=state_dir, default_grace=1.0, **options)


async def _ended_attempt_log(state_dir: Path) -> tuple[object, list[str]]:
    """Run one stand-in engine to its end under a provider that then stops; return its
    fence and its log's lines as that run served them."""
    provider = _provider(state_dir)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        fence = new_fence()
        await provider.launch(standin_job(), fence)
        assert (await provider.wait_ready(fence)).state == "ready"
        assert (await exchange(provider, fence, "POST", "/log", {"lines": 5})).status == 200
        assert (await provider.stop(fence, grace=1.0)).state == "stopped"
        lines = await provider.logs(fence, 1000)
        nursery.cancel_scope.cancel()
    assert any("line" in line for line in lines), lines
    return fence, lines


@pytest.mark.deadline(70)
async def test_an_ended_attempts_log_is_served_by_the_next_run_fenced_as_before(state_dir):
    with trio.fail_after(60):
        fence, lines = await _ended_attempt_log(state_dir)
        # The provider stopped: its attempt directories went, the log was kept.
        assert not any((state_dir / "attempts").iterdir())
        again = _provider(state_dir)
        async with trio.open_nursery() as nursery:
            await nursery.start(again.run)
            assert await again.logs(fence, 1000) == lines
            assert await again.logs(fence, 2) == lines[-2:]
            followed = [line async for line in again.follow_logs(fence, 3)]
            assert followed == lines[-3:]  # a kept log is complete: the follow ends
            with pytest.raises(StaleFence):
                await again.logs(attrs.evolve(fence, generation=fence.generation + 1), 10)
            with pytest.raises(UnknownAttempt):
                await again.logs(new_fence(), 10)
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_a_killed_runs_leftover_attempt_keeps_its_log_when_the_next_run_clears_it(
    state_dir,
):
    # What a SIGKILLed agent leaves: an attempt directory with its record and log (its
    # engine, if still there, is killed by the next run's clean-up, as before).
    directory, record = _kept_attempt(state_dir, "aleftover", 64)
    (directory / "log").write_text("the engine's last words\n")
    (directory / "attempt.json").write_text(json.dumps({**record, "provider": "process"}))
    fence = Fence(**record)
    with trio.fail_after(60):
        provider = _provider(state_dir)
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            assert not directory.exists()  # cleared, as before
            assert await provider.logs(fence, 10) == ["the engine's last words"]
            nursery.cancel_scope.cancel()


def _kept_attempt(root: Path, name: str, size: int) -> tuple[Path, dict]:
    directory = root / "attempts" / name
    directory.mkdir(parents=True)
    (directory / "log").write_bytes(b"x" * (size - 1) + b"\n")
    fence = new_fence()
    record = {
        "attempt_id": fence.attempt_id,
        "generation": fence.generation,
        "plan_digest": fence.plan_digest,
    }
    return directory, record


def test_kept_logs_are_bounded_in_total_size_the_oldest_going_first(tmp_path):
    kept = KeptLogs(tmp_path / "logs", max_bytes=2500)
    ids = []
    for number in range(3):
        directory, record = _kept_attempt(tmp_path, f"a{number}", 1000)
        kept.keep(directory, record)
        ids.append(record["attempt_id"])
        assert not (directory / "log").exists()  # moved, not copied
    assert [kept.fence(attempt_id) is not None for attempt_id in ids] == [False, True, True]
    assert sorted(path.name for path in (tmp_path / "logs").iterdir()) == ["a1", "a2"]
    # A later run reads the same index from the disk.
    later = KeptLogs(tmp_path / "logs", max_bytes=2500)
    later.load()
    assert [later.fence(attempt_id) is not None for attempt_id in ids] == [False, True, True]


def test_kept_logs_older_than_their_age_are_dropped_when_the_next_run_loads(tmp_path):
    kept = KeptLogs(tmp_path / "logs", max_age=3600)
    old_dir, old = _kept_attempt(tmp_path, "old", 100)
    new_dir, new = _kept_attempt(tmp_path, "new", 100)
    kept.keep(old_dir, old)
    kept.keep(new_dir, new)
    record = tmp_path / "logs" / "old" / KEPT_RECORD
    facts = json.loads(record.read_text())
    record.write_text(json.dumps({**facts, "kept_at": time.time() - 3601}))
    later = KeptLogs(tmp_path / "logs", max_age=3600)
    later.load()
    assert later.fence(old["attempt_id"]) is None
    assert later.fence(new["attempt_id"]) is not None
    assert not (tmp_path / "logs" / "old").exists()


def test_an_attempt_without_a_log_or_a_fence_keeps_nothing(tmp_path):
    kept = KeptLogs(tmp_path / "logs")
    directory, record = _kept_attempt(tmp_path, "a0", 10)
    kept.keep(directory, {})  # an unreadable record: nothing says whose log it is
    (directory / "log").unlink()
    kept.keep(directory, record)  # no log to keep
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())
