"""What the container provider does beyond the kit: pinning, sandbox flags, crash recovery."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import trio
from ficc_executor_container.provider import ContainerProvider

from ficc_core import ImageDigestMismatch, IsolationUnavailable, JobInput, Runtime, attempt_key
from ficc_core.testing import executor_kit as kit

pytestmark = pytest.mark.slow


async def _podman(*args: str) -> str:
    result = await trio.run_process(["podman", *args], capture_stdout=True, check=True)
    return result.stdout.decode()


def _runtime(image_digest: str) -> Runtime:
    return Runtime(
        executor_provider="container",
        package_digest="sha256:" + "0" * 64,
        image_digest=image_digest,
        isolation="container",
    )


async def test_snapshot_lists_the_pinned_runtime_image(provider, standin_image):
    snapshot = await provider.snapshot()
    assert snapshot.endpoint_version == 1
    assert [(r.name, r.image_digest) for r in snapshot.runtimes] == [("standin", standin_image)]
    assert snapshot.labels["isolation.network"] == "container-none"


async def test_a_runtime_whose_digest_is_not_the_local_image_is_refused(provider, standin_image):
    with trio.fail_after(60):
        with pytest.raises(ImageDigestMismatch) as refused:
            await provider.launch(
                kit.standin_job(), kit.new_fence(), runtime=_runtime("sha256:" + "f" * 64)
            )
        assert refused.value.code == "image_digest_mismatch"
        assert not list(provider.attempts_dir.iterdir())
        fence = kit.new_fence()
        await provider.launch(kit.standin_job(), fence, runtime=_runtime(standin_image))
        try:
            assert (await provider.wait_ready(fence)).state == "ready"
        finally:
            await provider.stop(fence, grace=1.0)


async def test_the_container_is_read_only_named_and_sees_only_its_inputs(provider, tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"weights")
    job = kit.standin_job(
        inputs=(JobInput(id="model", path=str(tmp_path)),), env={"ENGINE_OPTION": "1"}
    )
    with trio.fail_after(60):
        async with kit.launched(provider, job) as fence:
            name = provider.container_name(attempt_key(fence.attempt_id))
            names = await _podman("ps", "--filter", f"name={name}", "--format", "{{.Names}}")
            assert names.split() == [name]
            _, env = await kit.request_json(provider, fence, "GET", "/env")
            results = {}
            for path in (str(tmp_path / "new"), "/etc/new", env["cwd"] + "/scratch"):
                _, answer = await kit.request_json(
                    provider, fence, "POST", "/write", {"path": path}
                )
                results[path] = answer["result"]
    assert env["env"]["ENGINE_OPTION"] == "1"
    assert env["env"]["FICC_ENDPOINT_SOCKET"] == "/ficc/sock/engine.sock"
    assert "HOME" not in env["env"] or env["env"]["HOME"] == "/root"
    assert "Read-only file system" in results[str(tmp_path / "new")]
    assert "Read-only file system" in results["/etc/new"]
    assert results[env["cwd"] + "/scratch"] == "written"
    assert await _podman("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}") == ""


async def test_without_a_usable_container_engine_launch_is_refused(state_dir):
    provider = ContainerProvider(state_dir=state_dir, command=("/nonexistent/podman",))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            snapshot = await provider.snapshot()
            with pytest.raises(IsolationUnavailable):
                await provider.launch(kit.standin_job(), kit.new_fence())
            nursery.cancel_scope.cancel()
    assert snapshot.endpoint_version is None
    assert snapshot.labels["isolation.network"] == "unavailable"


async def _provider_host(options: dict, *extra: str) -> tuple[trio.Process, str, str]:
    """A container provider in a process of its own with one ready engine: the host,
    the engine's container name and the ``ps`` filter of this provider's containers."""
    command = [
        sys.executable, "-m", "ficc_core.testing.provider_host",
        "--provider", "ficc_executor_container.provider:ContainerProvider",
        "--options", json.dumps(options), *extra,
    ]  # fmt: skip
    host = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, start_new_session=True)
    label = f"label=ficc.state={ContainerProvider(**options).state_hash}"
    line = b""
    with trio.fail_after(120):
        while not line.endswith(b"\n"):
            data = await host.stdout.receive_some(4096)
            assert data, "the provider host exited before its engine was ready"
            line += data
    report = json.loads(line)
    name = ContainerProvider(**options).container_name(attempt_key(report["fence"]["attempt_id"]))
    return host, name, label


async def _end_host(host: trio.Process, label: str) -> None:
    host.kill()
    with trio.CancelScope(shield=True):
        await host.wait()
        await trio.run_process(
            ["sh", "-c", f"podman ps -aq --filter {label} | xargs -r podman rm -f -t 0"],
            check=False,
            capture_stdout=True,
        )


async def test_a_restarted_provider_removes_the_container_a_killed_one_left(options, standin_image):
    host, name, label = await _provider_host(options)
    try:
        host.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await host.wait()
        running = await _podman("ps", "--filter", label, "--format", "{{.Names}}")
        assert running.split() == [name], "the container should outlive its killed provider"
        provider = ContainerProvider(**options)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(provider.run)
                assert await _podman("ps", "-a", "--filter", label, "--format", "{{.Names}}") == ""
                assert not list(provider.attempts_dir.iterdir())
                nursery.cancel_scope.cancel()
    finally:
        await _end_host(host, label)


async def test_a_killed_providers_container_is_removed_once_its_lease_passes(
    options, standin_image
):
    lease = 3.0
    host, name, label = await _provider_host(options, "--lease", str(lease))
    try:
        host.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await host.wait()
        killed = trio.current_time()
        running = await _podman("ps", "--filter", label, "--format", "{{.Names}}")
        assert running.split() == [name], "its lease still runs"
        # Nothing of the provider runs now: the lease watchdog removes the container.
        with trio.move_on_after(lease + 20):
            while await _podman("ps", "-a", "--filter", label, "--format", "{{.Names}}"):  # noqa: ASYNC110
                await trio.sleep(0.2)
        assert await _podman("ps", "-a", "--filter", label, "--format", "{{.Names}}") == ""
        assert trio.current_time() - killed >= lease - 0.5
    finally:
        await _end_host(host, label)


async def test_a_ready_containers_status_names_its_main_pid_and_the_probes_answer(provider):
    with trio.fail_after(60):
        async with kit.launched(provider, kit.standin_job()) as fence:
            status = await provider.status(fence)
            name = provider.container_name(attempt_key(fence.attempt_id))
            reported = int((await _podman("inspect", "--format", "{{.State.Pid}}", name)).strip())
            assert status.pid == reported > 0
            assert (status.health, status.state) == ("200", "ready")
            assert status.started_at <= status.health_at
