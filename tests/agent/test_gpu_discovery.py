"""GPU discovery on a node: NVIDIA's ``nvidia-smi -q -x`` fixtures, NVML, device visibility.

The machine running these tests has no GPU: ``nvidia-smi`` is a script answering with
fixtures written to NVIDIA's documented XML schema (``nvsmi_device_v12.dtd``) for
several shapes, and NVML a stand-in module with pynvml's names: both are true edges.
The agent, its snapshot and the process provider launching an engine are real.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from ficc_executor_process.provider import ProcessProvider

from ficc_core.agent import Agent, AgentSettings, GpuDiscovery, discover_gpus, parse_nvidia_smi_xml
from ficc_core.agent.gpus import parse_topology, read_nvml, visible_devices
from ficc_core.schema import GpuRequest, ResourceLimits
from ficc_core.testing import executor_kit as kit

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
MIB = 1024 * 1024


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def fake_nvidia_smi(folder: Path, xml: str | None, topology: str = "", exit_code: int = 0) -> Path:
    """An ``nvidia-smi`` answering ``-q -x`` with the ``xml`` fixture and ``topo -m`` with
    ``topology``; with ``exit_code``, failing as a broken driver does."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    if exit_code:
        body = (
            "echo 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the "
            f"NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.'\n"
            f"exit {exit_code}\n"
        )
    else:
        body = (
            f'if [ "$1" = topo ]; then cat "{FIXTURES / topology}"; exit 0; fi\n'
            if topology
            else 'if [ "$1" = topo ]; then exit 1; fi\n'
        )
        body += f'cat "{FIXTURES / xml}"\n'
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


@pytest.fixture
def folder():
    path = Path(tempfile.mkdtemp(prefix="fg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the fixtures' shapes --------------------------------------------------------------------


def test_one_gpu_gives_its_index_uuid_name_memory_and_utilisation():
    inventory = parse_nvidia_smi_xml(fixture("one_gpu.xml"))
    assert (inventory.source, inventory.driver, inventory.error) == (
        "nvidia-smi",
        "550.54.15",
        None,
    )
    [gpu] = inventory.devices
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-4b9f5c2e-9d1a-4c33-8a59-0f6b1c2d3e01"
    assert gpu.memory_bytes == 81559 * MIB
    assert gpu.memory_free_bytes == (81559 - 1024) * MIB
    assert gpu.utilization == 37
    assert gpu.mig is None and gpu.nvlink_peers is None


def test_eight_gpus_with_nvlink_are_numbered_in_nvidia_smis_order_with_their_peers():
    inventory = parse_nvidia_smi_xml(fixture("eight_gpus.xml"), fixture("eight_gpus_topo.txt"))
    assert [gpu.index for gpu in inventory.devices] == list(range(8))
    # Device nodes (minor numbers) 4 and 5 are swapped in the fixture: indexes follow the
    # listing (PCI order), as NVML's do, never the minor number.
    assert [gpu.uuid[-1] for gpu in inventory.devices] == [str(i) for i in range(8)]
    assert inventory.devices[3].nvlink_peers == (0, 1, 2, 4, 5, 6, 7)
    assert all(len(gpu.nvlink_peers) == 7 for gpu in inventory.devices)
    assert inventory.devices[7].memory_bytes == 143771 * MIB
    assert inventory.driver == "560.35.03"


def test_topology_without_nvlink_has_no_peers():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-15\nGPU1\tPHB\t X \t0-15\n"
    assert parse_topology(text) == {0: (), 1: ()}


def test_mig_instances_are_listed_with_their_memory_and_utilisation_is_left_out():
    [gpu] = parse_nvidia_smi_xml(fixture("mig.xml")).devices
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert [(m.gpu_instance_id, m.compute_instance_id, m.memory_bytes) for m in gpu.mig] == [
        (1, 0, 40192 * MIB),
        (2, 0, 19968 * MIB),
        (3, 0, 9728 * MIB),
    ]
    assert gpu.utilization is None  # "N/A" under MIG


def test_output_that_is_not_xml_is_an_error_not_a_crash():
    inventory = parse_nvidia_smi_xml("Failed to initialize NVML: Driver/library version mismatch")
    assert inventory.devices == () and "not XML" in inventory.error


# -- discovery through a real subprocess ----------------------------------------------------


@pytest.mark.deadline(40)
async def test_discovery_falls_back_to_nvidia_smi_and_reads_the_topology(folder):
    script = fake_nvidia_smi(folder, "eight_gpus.xml", "eight_gpus_topo.txt")
    with trio.fail_after(30):
        inventory = await discover_gpus(str(script))
    # This machine has no NVML library: the fallback answers, and that is not an error.
    assert inventory.source == "nvidia-smi" and inventory.error is None
    assert len(inventory.devices) == 8 and inventory.devices[0].nvlink_peers[0] == 1


async def test_a_node_without_a_driver_has_no_gpus_and_no_error():
    with trio.fail_after(10):
        inventory = await discover_gpus("ficc-no-such-nvidia-smi")
    assert (inventory.devices, inventory.error) == ((), None)


@pytest.mark.deadline(40)
async def test_a_broken_driver_is_reported_in_the_snapshot_not_hidden(folder):
    script = fake_nvidia_smi(folder, None, exit_code=9)

    async def discover():
        return await discover_gpus(str(script))

    agent = _agent(folder, gpu_query=GpuDiscovery(discover=discover).inventory)
    with trio.fail_after(30):
        snapshot = await agent.snapshot()
    assert snapshot.resources.gpus == ()
    assert "exited 9" in snapshot.resources.gpu_error
    assert "communicate with the NVIDIA driver" in snapshot.resources.gpu_error


async def test_skip_gpus_reports_none_without_asking(folder):
    asked = []

    async def discover():
        asked.append(1)
        return parse_nvidia_smi_xml(fixture("one_gpu.xml"))

    settings = AgentSettings.from_document({"skip_gpus": True}, "agent.toml")
    assert settings.skip_gpus
    discovery = GpuDiscovery(skip=settings.skip_gpus, discover=discover)
    assert (await discovery.inventory()).devices == () and asked == []


async def test_discovery_runs_again_only_after_its_refresh(folder, autojump_clock):
    calls = []

    async def discover():
        calls.append(trio.current_time())
        return parse_nvidia_smi_xml(fixture("one_gpu.xml"))

    discovery = GpuDiscovery(refresh=10, discover=discover)
    await discovery.inventory()
    await trio.sleep(5)
    await discovery.inventory()
    assert len(calls) == 1
    await trio.sleep(6)
    await discovery.inventory()
    assert len(calls) == 2


# -- NVML -------------------------------------------------------------------------------------


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _nvml(*, init_error: int | None = None):
    """A stand-in for pynvml: two GPUs joined by one NVLink, the second in MIG mode."""
    gpus = [
        {"bus": "00000000:07:00.0", "uuid": "GPU-aaaa", "mig": False, "links": {0: 1}},
        {"bus": "00000000:0F:00.0", "uuid": "GPU-bbbb", "mig": True, "links": {0: 0}},
    ]
    migs = {(1, 0): SimpleNamespace(gi=1, ci=0, total=40 << 30, uuid="MIG-cccc")}

    def fail(value=999):
        raise _NVMLError(value)

    def init():
        if init_error is not None:
            fail(init_error)

    def link_state(handle, link):
        return 1 if link in gpus[handle]["links"] else fail(3)

    def mig_handle(handle, position):
        return migs.get((handle, position)) or fail(6)

    return SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_DEVICE_MIG_ENABLE=1,
        NVML_FEATURE_ENABLED=1,
        NVML_NVLINK_MAX_LINKS=18,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"560.35.03",
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=gpus[h]["bus"].encode()),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100",
        nvmlDeviceGetUUID=lambda h: h.uuid if isinstance(h, SimpleNamespace) else gpus[h]["uuid"],
        nvmlDeviceGetMemoryInfo=lambda h: (
            SimpleNamespace(total=h.total, free=h.total)
            if isinstance(h, SimpleNamespace)
            else SimpleNamespace(total=80 << 30, free=70 << 30)
        ),
        nvmlDeviceGetUtilizationRates=lambda h: (
            fail(3) if gpus[h]["mig"] else SimpleNamespace(gpu=42)
        ),
        nvmlDeviceGetMigMode=lambda h: (1, 1) if gpus[h]["mig"] else (0, 0),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetGpuInstanceId=lambda m: m.gi,
        nvmlDeviceGetComputeInstanceId=lambda m: m.ci,
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: SimpleNamespace(
            busId=gpus[gpus[h]["links"][link]]["bus"].encode()
        ),
    )


def test_nvml_gives_devices_mig_instances_and_nvlink_peers():
    inventory = read_nvml(_nvml())
    assert (inventory.source, inventory.driver, inventory.error) == ("nvml", "560.35.03", None)
    first, second = inventory.devices
    assert (first.uuid, first.utilization, first.memory_free_bytes) == ("GPU-aaaa", 42, 70 << 30)
    assert first.nvlink_peers == (1,) and second.nvlink_peers == (0,)
    assert first.mig is None
    assert [(m.gpu_instance_id, m.uuid) for m in second.mig] == [(1, "MIG-cccc")]
    assert second.utilization is None


def test_nvml_without_its_library_is_no_gpus_and_a_failing_one_is_an_error():
    assert read_nvml(_nvml(init_error=12)) is None
    broken = read_nvml(_nvml(init_error=18))
    assert broken.devices == () and "NVML failed to start" in broken.error


# -- device visibility ---------------------------------------------------------------------


def _agent(folder: Path, **options) -> Agent:
    return Agent(
        node_id="gpu-node",
        providers={"process": ProcessProvider(state_dir=folder / "p", default_grace=1.0)},
        state_dir=folder,
        stop_grace=1.0,
        **options,
    )


def _limits(*indexes: int) -> ResourceLimits:
    return ResourceLimits(
        cpus=1,
        memory_bytes=1 << 30,
        gpus=tuple(GpuRequest(index=i, memory_bytes=1 << 30) for i in indexes),
    )


def test_visibility_names_reserved_gpus_by_uuid_and_hides_them_from_cpu_replicas():
    devices = parse_nvidia_smi_xml(fixture("two_gpus.xml")).devices
    shown = visible_devices(_limits(1), devices)
    assert shown == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "GPU-l40s0000-0000-4000-8000-000000000001",
    }
    assert visible_devices(_limits(), devices)["CUDA_VISIBLE_DEVICES"] == ""
    assert visible_devices(_limits(), ()) == {}


@pytest.mark.deadline(70)
async def test_a_placement_on_gpu_1_of_a_two_gpu_node_shows_the_engine_exactly_that_device(
    folder,
):
    script = fake_nvidia_smi(folder / "bin", "two_gpus.xml")

    async def discover():
        return await discover_gpus(str(script))

    agent = _agent(folder, gpu_query=GpuDiscovery(discover=discover).inventory)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(agent.run)
            snapshot = await agent.snapshot()
            assert [gpu.index for gpu in snapshot.resources.gpus] == [0, 1]
            seen = {}
            for indexes in ((1,), ()):
                fence = kit.new_fence()
                await agent.launch("process", kit.standin_job(), fence, limits=_limits(*indexes))
                while (await agent.status(fence)).state != "ready":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                _, answer = await kit.request_json(agent, fence, "GET", "/env")
                seen[indexes] = answer["env"]
                await agent.stop(fence, grace=1.0)
        nursery.cancel_scope.cancel()
    on_gpu_1 = seen[(1,)]
    assert on_gpu_1["CUDA_VISIBLE_DEVICES"] == snapshot.resources.gpus[1].uuid
    assert on_gpu_1["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen[()]["CUDA_VISIBLE_DEVICES"] == ""  # a CPU replica sees no GPU


def test_a_container_gets_device_requests_for_its_gpus_only():
    from ficc_executor_container.provider import gpu_device_args

    assert gpu_device_args(_limits(1, 3)) == [
        "--device",
        "nvidia.com/gpu=1",
        "--device",
        "nvidia.com/gpu=3",
    ]
    assert gpu_device_args(_limits()) == [] and gpu_device_args(None) == []


@pytest.mark.deadline(130)
async def test_a_service_placed_on_gpu_1_of_a_two_gpu_node_runs_with_only_that_device(
    tmp_path, monkeypatch
):
    """Through the controller: discovery on the embedded node (its nvidia-smi the
    two-GPU fixture), a placement reserving GPU 1, the engine's real environment."""
    import os

    from ..support.inference_support import llama_spec, open_inference_controller, register_gguf
    from ..support.inference_support import standin_engine as standin_runtime
    from ..support.models_support import tiny_gguf

    script = fake_nvidia_smi(tmp_path / "bin", "two_gpus.xml")
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    engine, settings = standin_runtime(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            node = await controller.node()
            gpus = node["snapshot"]["resources"]["gpus"]
            assert [g["index"] for g in gpus] == [0, 1]
            assert node["snapshot"]["resources"]["gpu_source"] == "nvidia-smi"
            tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
            model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
            spec = await llama_spec(controller, model_id, alias="on-gpu-1", memory_bytes=256 << 20)
            spec["image_executable"] = str(engine)
            spec["placements"][0]["limits"]["gpus"] = [{"index": 1, "memory_bytes": 8 << 30}]
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            assert (await controller.control(created["id"], "start")).status_code == 200
            await controller.wait_service(created["id"], lambda v: v["state"] == "ready")
            status = await controller.ok("GET", f"/api/v1/inference/{created['id']}/status")
            pid = status["replicas"][0]["pid"]
            raw = await trio.to_thread.run_sync(Path(f"/proc/{pid}/environ").read_bytes)
            node = await controller.node()
    environ = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
    assert environ["CUDA_VISIBLE_DEVICES"] == gpus[1]["uuid"]
    assert environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    [held] = node["reservations"]
    assert held["gpus"] == [{"index": 1, "memory_bytes": 8 << 30}]
