"""What the process provider does beyond the kit: sandbox details, snapshot, crash recovery."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio
from ficc_executor_process.provider import ProcessProvider

from ficc_core import IsolationUnavailable, JobInput, ResourceLimits, attempt_key
from ficc_core.executor import BoundedLog
from ficc_core.testing import executor_kit as kit


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_the_engine_sees_only_the_jobs_environment_and_a_private_directory(provider):
    job = kit.standin_job(env={"ENGINE_OPTION": "1"})
    with trio.fail_after(30):
        async with kit.launched(provider, job) as fence:
            _, answer = await kit.request_json(provider, fence, "GET", "/env")
    # Python itself adds LC_CTYPE when it starts under the C locale (PEP 538).
    seen = set(answer["env"]) - {"LC_CTYPE"}
    assert seen == {"ENGINE_OPTION", "FICC_ENDPOINT_SOCKET", "FICC_ATTEMPT_DIR"}
    assert answer["cwd"].startswith(str(provider.attempts_dir))
    assert answer["cwd"].endswith("/work")


async def test_inputs_are_read_only_and_the_working_directory_is_writable(provider, tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"weights")
    job = kit.standin_job(inputs=(JobInput(id="model", path=str(tmp_path)),))
    with trio.fail_after(30):
        async with kit.launched(provider, job) as fence:
            _, env = await kit.request_json(provider, fence, "GET", "/env")
            _, on_input = await kit.request_json(
                provider, fence, "POST", "/write", {"path": str(tmp_path / "new")}
            )
            _, in_work = await kit.request_json(
                provider, fence, "POST", "/write", {"path": env["cwd"] + "/scratch"}
            )
    assert "Read-only file system" in on_input["result"]
    assert in_work["result"] == "written"
    assert not (tmp_path / "new").exists()
    # The host still sees the input writable: only the engine's mount namespace changed.
    (tmp_path / "host-can-write").write_text("x")


async def test_snapshot_offers_inference_when_isolation_works(provider):
    snapshot = await provider.snapshot()
    assert snapshot.endpoint_version == 1
    assert snapshot.supports_inference
    assert snapshot.labels["isolation.network"] == "netns"
    assert [p.name for p in snapshot.providers] == ["process"]
    assert snapshot.resources.cpus >= 1


async def test_without_network_isolation_the_snapshot_says_so_and_launch_is_refused(
    state_dir, monkeypatch
):
    async def no_namespaces(self):
        return "unshare(CLONE_NEWNET): Operation not permitted"

    # The one fake: this host can create namespaces, so the probe's answer is replaced.
    monkeypatch.setattr(ProcessProvider, "_probe_isolation", no_namespaces)
    provider = ProcessProvider(state_dir=state_dir)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            snapshot = await provider.snapshot()
            with pytest.raises(IsolationUnavailable) as refused:
                await provider.launch(kit.standin_job(), kit.new_fence())
            nursery.cancel_scope.cancel()
    assert snapshot.endpoint_version is None
    assert not snapshot.supports_inference
    assert snapshot.labels["isolation.network"] == "unavailable"
    assert refused.value.code == "isolation_unavailable"
    assert "Operation not permitted" in refused.value.message
    assert not list(provider.attempts_dir.iterdir())


async def test_stopping_the_provider_leaves_no_engine_or_child_behind(state_dir):
    provider = ProcessProvider(state_dir=state_dir, default_grace=1.0)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            fence = kit.new_fence()
            await provider.launch(
                kit.standin_job(), fence, limits=ResourceLimits(cpus=1, memory_bytes=2**30)
            )
            await provider.wait_ready(fence)
            _, env = await kit.request_json(provider, fence, "GET", "/env")
            _, child = await kit.request_json(provider, fence, "POST", "/spawn", {})
            assert _alive(env["pid"]) and _alive(child["pid"])
            record = provider.attempts_dir / attempt_key(fence.attempt_id) / "attempt.json"
            watchdog = json.loads(record.read_text())["watchdog"]["pid"]
            assert _alive(watchdog)
            nursery.cancel_scope.cancel()
    assert not _alive(env["pid"])
    # The engine's lease watchdog was dismissed (and reaped) with it.
    assert not _alive(watchdog)
    # The child left the process group (setsid) but not the cgroup.
    assert not _alive(child["pid"])


async def _provider_host(state_dir: Path, *extra: str) -> tuple[trio.Process, dict]:
    """A process provider in a process of its own, with one ready engine; its report."""
    options = json.dumps({"state_dir": str(state_dir), "default_grace": 1.0})
    command = [
        sys.executable, "-m", "ficc_core.testing.provider_host",
        "--provider", "ficc_executor_process.provider:ProcessProvider",
        "--options", options, *extra,
    ]  # fmt: skip
    host = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, start_new_session=True)
    line = b""
    with trio.fail_after(60):
        while not line.endswith(b"\n"):
            data = await host.stdout.receive_some(4096)
            assert data, "the provider host exited before its engine was ready"
            line += data
    return host, json.loads(line)


async def test_a_restarted_provider_removes_what_a_killed_one_left(state_dir):
    host, report = await _provider_host(state_dir)
    pids: list[int] = []
    try:
        pids = [report["engine_pid"], report["child_pid"]]
        host.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await host.wait()
        assert all(_alive(pid) for pid in pids), "the engine should outlive its killed provider"
        sockets = _socket_dirs(state_dir)
        assert [_socket_facts(directory / "engine.sock")[0] for directory in sockets] == [True]
        provider = ProcessProvider(state_dir=state_dir)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(provider.run)
                assert not any(_alive(pid) for pid in pids)
                assert not list(provider.attempts_dir.iterdir())
                assert _socket_facts(sockets[0] / "engine.sock")[:2] == (False, None)
                nursery.cancel_scope.cancel()
    finally:
        host.kill()
        with trio.CancelScope(shield=True):
            await host.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_a_killed_providers_engine_is_stopped_on_the_node_once_its_lease_passes(state_dir):
    lease = 2.0
    host, report = await _provider_host(state_dir, "--lease", str(lease))
    pids = [report["engine_pid"], report["child_pid"]]
    try:
        host.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await host.wait()
        killed = trio.current_time()
        assert all(_alive(pid) for pid in pids), "its lease still runs"
        # Nothing of the provider runs now: the lease watchdog stops the engine, and
        # the child that left its process group goes with the engine's cgroup.
        with trio.move_on_after(lease + 5):
            while any(_alive(pid) for pid in pids):  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert not any(_alive(pid) for pid in pids), "the engine outlived its lease"
        assert trio.current_time() - killed >= lease - 0.5
    finally:
        host.kill()
        with trio.CancelScope(shield=True):
            await host.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # The next provider on the directory removes what is left (records, cgroups).
    provider = ProcessProvider(state_dir=state_dir)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            assert not list(provider.attempts_dir.iterdir())
            nursery.cancel_scope.cancel()


async def test_too_many_streams_are_refused_and_idle_streams_expire(state_dir):
    provider = ProcessProvider(state_dir=state_dir, max_streams=2, stream_idle_timeout=0.5)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            async with kit.launched(provider, kit.standin_job()) as fence:
                await provider.open(fence, "a", "GET", "/slow", {}, b"")
                await provider.open(fence, "b", "GET", "/slow", {}, b"")
                with pytest.raises(Exception) as refused:
                    await provider.open(fence, "c", "GET", "/slow", {}, b"")
                assert refused.value.code == "too_many_streams"
                await trio.sleep(1.0)
                with pytest.raises(Exception) as expired:
                    await provider.read(fence, "a")
                assert expired.value.code == "unknown_stream"
                await provider.open(fence, "c", "GET", "/health", {}, b"")
            nursery.cancel_scope.cancel()


async def test_a_log_never_holds_more_than_its_bound(tmp_path):
    log = BoundedLog(tmp_path, max_bytes=10_000)
    with trio.fail_after(30):
        for number in range(2_000):
            await log.write(f"line {number}\n".encode())
    sizes = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert sizes <= 10_000
    assert (await log.tail(1)) == ["line 1999"]


async def test_without_cgroups_the_engine_is_still_isolated_and_never_orphaned(state_dir):
    provider = ProcessProvider(state_dir=state_dir, use_cgroups=False, default_grace=1.0)
    limits = ResourceLimits(cpus=1, memory_bytes=2**30, open_files=256)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            snapshot = await provider.snapshot()
            await kit.check_network_isolation(provider)
            await kit.check_clean_stop(provider)
            fence = kit.new_fence()
            await provider.launch(kit.standin_job(ignore_sigterm=True), fence, limits=limits)
            await provider.wait_ready(fence)
            _, env = await kit.request_json(provider, fence, "GET", "/env")
            limits_file = await trio.to_thread.run_sync(
                Path(f"/proc/{env['pid']}/limits").read_text
            )
            nursery.cancel_scope.cancel()
    assert snapshot.labels["limits.memory"] == "rlimit-as"
    assert snapshot.labels["limits.cpu"] == "affinity"
    assert "Max address space" in limits_file and str(2**30) in limits_file
    assert any(
        line.startswith("Max open files") and " 256 " in line for line in limits_file.splitlines()
    )
    # It ignored SIGTERM, so the provider's shutdown had to SIGKILL it after the grace.
    assert not _alive(env["pid"])
    assert not list(provider.attempts_dir.iterdir())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to spread over")
async def test_without_a_cpu_cgroup_engines_spread_over_the_cpus_not_all_on_the_first(
    state_dir,
):
    # Every engine of one CPU or less was held to the node's first CPU.
    provider = ProcessProvider(state_dir=state_dir, use_cgroups=False, default_grace=1.0)
    one = ResourceLimits(cpus=0.5, memory_bytes=2**30)
    available = sorted(os.sched_getaffinity(0))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)

            async def cpus(fence) -> set[int]:
                _, env = await kit.request_json(provider, fence, "GET", "/env")
                return os.sched_getaffinity(env["pid"])

            async with kit.launched(provider, kit.standin_job(), limits=one) as first:
                async with kit.launched(provider, kit.standin_job(), limits=one) as second:
                    cores = [await cpus(first), await cpus(second)]
                assert cores == [{available[0]}, {available[1]}]
                # The second ended: its CPU is the least held again.
                async with kit.launched(provider, kit.standin_job(), limits=one) as third:
                    assert await cpus(third) == {available[1]}
            nursery.cancel_scope.cancel()


async def test_status_names_the_engines_pid_its_start_and_the_probes_last_answer(provider):
    before = time.time()
    job = kit.standin_job(ready_after=1.0)
    with trio.fail_after(30):
        async with kit.launched(provider, job, wait_ready=False) as fence:
            launched = await provider.status(fence)
            assert launched.pid is not None and launched.started_at >= before
            # While the engine loads, the probe's answers show: 503 until it is ready.
            while (status := await provider.status(fence)).health != "503":  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert status.state == "starting" and status.health_at >= status.started_at
            status = await provider.wait_ready(fence)
            assert (status.state, status.health) == ("ready", "200")
            assert status.health_at >= status.started_at
            # The sandbox execs the engine: the PID is the engine's own.
            _, answer = await kit.request_json(provider, fence, "GET", "/env")
            assert answer["pid"] == status.pid == launched.pid
            os.kill(status.pid, signal.SIGKILL)
            ended = await provider.wait_ended(fence)
    assert (ended.state, ended.signal, ended.reason) == ("exited", 9, "killed")
    assert (ended.pid, ended.started_at) == (status.pid, status.started_at)


def _socket_dirs(state_dir: Path) -> list[Path]:
    """The socket directories of the attempts recorded in ``state_dir``."""
    from ficc_core.executor.runtime_dir import default_runtime_dir, socket_dir

    return [
        socket_dir(default_runtime_dir(), state_dir.absolute(), record.name)
        for record in (state_dir / "attempts").iterdir()
    ]


def _socket_facts(socket_path: Path) -> tuple[bool, int | None, int]:
    """Whether the socket exists, its directory's mode (None: gone), the runtime
    directory's mode."""
    directory = None
    if socket_path.parent.exists():
        directory = socket_path.parent.stat().st_mode & 0o777
    return socket_path.is_socket(), directory, socket_path.parent.parent.stat().st_mode & 0o777


async def test_an_engine_socket_fits_whatever_the_state_directory_and_leaves_no_litter(
    tmp_path,
):
    """A state directory of any length (a long HOME): the socket lives in the short
    runtime directory, in a private directory of its own that goes when the engine ends."""
    from ficc_executor_process.testing import running_process_provider

    from ficc_core.executor.runtime_dir import MAX_SOCKET_PATH, default_runtime_dir

    state_dir = tmp_path / ("h" * 60) / ("s" * 60) / "process"
    assert len(str(state_dir)) > 150
    job = kit.standin_job()
    async with running_process_provider(state_dir, default_grace=2.0) as provider:
        with trio.fail_after(30):
            async with kit.launched(provider, job) as fence:
                _, answer = await kit.request_json(provider, fence, "GET", "/env")
                socket_path = Path(answer["env"]["FICC_ENDPOINT_SOCKET"])
                assert socket_path.parent.parent == default_runtime_dir()
                assert len(os.fsencode(socket_path)) <= MAX_SOCKET_PATH
                assert _socket_facts(socket_path) == (True, 0o700, 0o700)
            await provider.wait_ended(fence)
        assert _socket_facts(socket_path) == (False, None, 0o700)


async def test_a_runtime_directory_too_long_for_a_socket_is_refused_naming_its_setting(
    state_dir,
):
    from ficc_core.executor.errors import RuntimeDirUnusable

    too_long = "/tmp/" + "r" * 60
    provider = ProcessProvider(state_dir=state_dir, runtime_dir=too_long)
    with pytest.raises(RuntimeDirUnusable) as refused, trio.fail_after(30):
        await provider.run()  # refused before it reports started
    assert refused.value.details["setting"] == "runtime_dir"
    assert "FICC_RUNTIME_DIR" in refused.value.message
    assert not await trio.to_thread.run_sync(os.path.lexists, too_long)


def test_a_runtime_directory_someone_else_owns_or_a_link_is_refused():
    from ficc_core.executor.errors import RuntimeDirUnusable
    from ficc_core.executor.runtime_dir import ensure_runtime_dir

    top = Path(tempfile.mkdtemp(prefix="rl-", dir="/tmp"))  # short, as a runtime dir is
    try:
        (top / "elsewhere").mkdir()
        (top / "link").symlink_to(top / "elsewhere")
        with pytest.raises(RuntimeDirUnusable, match="link"):
            ensure_runtime_dir(top / "link")
        if os.getuid() == 0:  # only root can give a directory away
            (top / "foreign").mkdir()
            os.chown(top / "foreign", 65534, 65534)
            with pytest.raises(RuntimeDirUnusable, match="belongs to user 65534"):
                ensure_runtime_dir(top / "foreign")
        (top / "open").mkdir(mode=0o755)
        ensure_runtime_dir(top / "open")  # ours: made private
        assert (top / "open").stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(top, ignore_errors=True)


async def test_a_runtime_directory_removed_while_the_provider_runs_is_made_again_at_launch(
    state_dir,
):
    from ficc_executor_process.testing import running_process_provider

    runtime_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp")) / "run"
    try:
        async with running_process_provider(state_dir, runtime_dir=runtime_dir) as provider:
            await trio.to_thread.run_sync(shutil.rmtree, runtime_dir)  # a /tmp cleaner
            with trio.fail_after(30):
                async with kit.launched(provider, kit.standin_job()) as fence:
                    _, answer = await kit.request_json(provider, fence, "GET", "/env")
            socket_path = Path(answer["env"]["FICC_ENDPOINT_SOCKET"])
            assert socket_path.parent.parent == runtime_dir
    finally:
        await trio.to_thread.run_sync(shutil.rmtree, runtime_dir.parent, True)
