"""GPU discovery: NVML (the ``nvidia-ml-py`` binding) first, ``nvidia-smi`` as the fallback.

What a node reports, and why:

- **No driver, no GPUs, no error.** A CPU node has neither ``libnvidia-ml`` nor
  ``nvidia-smi``: it reports no GPUs and says nothing about it.
- **A broken driver is reported, not hidden.** When the library or the binary is there
  but fails (a driver/library version mismatch, a wedged device), the node reports no
  GPUs and ``gpu_error`` says why, so an operator sees "driver broken" on the node
  rather than a GPU node that silently took no GPU work.
- **Indexes are NVML's** (the order ``nvidia-smi`` lists them in: PCI bus order), the
  ones placements name. An engine is shown its reserved devices by UUID
  (:func:`visible_devices`), because CUDA's own default order is "fastest first", not
  PCI order: index 1 in a placement and device 1 in CUDA need not be the same GPU.
- **Free memory and utilisation change**, so discovery runs again at most every
  :data:`REFRESH` seconds (NVML answers in microseconds; ``nvidia-smi`` takes tens of
  milliseconds and can hang on a wedged driver, hence its bound).
"""

from __future__ import annotations

import logging
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import attrs
import trio

from ..schema import GpuDevice, ResourceLimits
from ..schema.snapshot import MigDevice

log = logging.getLogger("ficc.agent")

NVIDIA_SMI_XML = ("-q", "-x")
NVIDIA_SMI_TOPOLOGY = ("topo", "-m")
#: nvidia-smi can hang when a driver is wedged; a node without GPU facts still works.
NVIDIA_SMI_TIMEOUT = 10.0
#: The most of nvidia-smi's output read (eight GPUs with MIG are about 100 KiB).
NVIDIA_SMI_MAX_OUTPUT = 8 << 20
#: Seconds between two discoveries (free memory and utilisation move).
REFRESH = 10.0
MIB = 1024 * 1024


@attrs.frozen
class GpuInventory:
    """What discovery found: the devices, where from, the driver, or why it failed."""

    devices: tuple[GpuDevice, ...] = ()
    source: str | None = None
    driver: str | None = None
    error: str | None = None


# -- nvidia-smi -q -x -----------------------------------------------------------------------


def _mib(element: ET.Element | None, tag: str) -> int | None:
    """``<tag>81559 MiB</tag>`` under ``element`` in bytes; None for N/A or absent."""
    if element is None:
        return None
    found = re.fullmatch(r"\s*(\d+)\s*MiB\s*", element.findtext(tag) or "")
    return int(found.group(1)) * MIB if found else None


def _int(text: str | None) -> int | None:
    found = re.fullmatch(r"\s*(\d+)\s*%?\s*", text or "")
    return int(found.group(1)) if found else None


def parse_topology(text: str) -> dict[int, tuple[int, ...]]:
    """``nvidia-smi topo -m``'s matrix: each GPU's NVLink peers (cells ``NV<n>``)."""
    columns: list[int] = []
    peers: dict[int, tuple[int, ...]] = {}
    for line in text.splitlines():
        cells = line.split("\t")
        if not columns:
            columns = [int(c.strip()[3:]) for c in cells if re.fullmatch(r"\s*GPU\d+\s*", c)]
            continue
        row = re.fullmatch(r"GPU(\d+)", cells[0].strip())
        if row is None:
            continue
        links = [
            columns[position]
            for position, cell in enumerate(cells[1 : len(columns) + 1])
            if re.fullmatch(r"\s*NV\d+\s*", cell)
        ]
        peers[int(row.group(1))] = tuple(links)
    return peers


def parse_nvidia_smi_xml(text: str, topology: str = "") -> GpuInventory:
    """Parse ``nvidia-smi -q -x`` (NVIDIA's ``nvsmi_device`` schema) into an inventory.

    A GPU is the ``index``-th ``<gpu>`` element (nvidia-smi's own numbering); fields it
    shows as ``N/A`` are left out. ``topology`` is ``nvidia-smi topo -m``, for NVLink.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        return GpuInventory(source="nvidia-smi", error=f"nvidia-smi -q -x is not XML: {exc}")
    links = parse_topology(topology) if topology else {}
    devices = []
    for index, gpu in enumerate(root.findall("gpu")):
        memory = gpu.find("fb_memory_usage")
        mig = None
        if (gpu.findtext("mig_mode/current_mig") or "").strip() == "Enabled":
            mig = tuple(
                MigDevice(
                    gpu_instance_id=_int(item.findtext("gpu_instance_id")) or 0,
                    compute_instance_id=_int(item.findtext("compute_instance_id")) or 0,
                    memory_bytes=_mib(item.find("fb_memory_usage"), "total") or 0,
                )
                for item in gpu.findall("mig_devices/mig_device")
            )
        devices.append(
            GpuDevice(
                index=index,
                name=(gpu.findtext("product_name") or "GPU").strip()[:256],
                memory_bytes=_mib(memory, "total") or 0,
                uuid=(gpu.findtext("uuid") or "").strip() or None,
                memory_free_bytes=_mib(memory, "free"),
                utilization=_int(gpu.findtext("utilization/gpu_util")),
                mig=mig,
                nvlink_peers=links.get(index) if links else None,
            )
        )
    driver = (root.findtext("driver_version") or "").strip() or None
    return GpuInventory(tuple(devices), "nvidia-smi", driver)


async def _run(binary: str, *args: str) -> tuple[int, str]:
    with trio.fail_after(NVIDIA_SMI_TIMEOUT):
        result = await trio.run_process(
            [binary, *args], capture_stdout=True, capture_stderr=True, check=False
        )
    output = (result.stdout or b"")[:NVIDIA_SMI_MAX_OUTPUT] + (result.stderr or b"")[:4096]
    return result.returncode, output.decode("utf-8", "replace")


async def query_nvidia_smi(binary: str = "nvidia-smi") -> GpuInventory | None:
    """Ask ``nvidia-smi``; None when it is not installed (a node without a driver)."""
    path = shutil.which(binary)
    if path is None:
        return None
    try:
        code, text = await _run(path, *NVIDIA_SMI_XML)
        if code != 0:
            first = text.strip().splitlines()[:1] or ["no output"]
            return GpuInventory(source="nvidia-smi", error=f"nvidia-smi exited {code}: {first[0]}")
        topology_code, topology = await _run(path, *NVIDIA_SMI_TOPOLOGY)
    except (OSError, trio.TooSlowError) as exc:
        return GpuInventory(source="nvidia-smi", error=f"nvidia-smi did not answer: {exc!r}")
    return parse_nvidia_smi_xml(text, topology if topology_code == 0 else "")


# -- NVML -----------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(nvml: Any = None) -> GpuInventory | None:
    """Read the GPUs through NVML (blocking: call in a thread); None when NVML's library
    is not installed. ``nvml`` is the ``pynvml`` module (tests pass their own)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return None
        return GpuInventory(source="nvml", error=f"NVML failed to start: {exc}")
    try:
        return _read_devices(nvml)
    except nvml.NVMLError as exc:
        return GpuInventory(source="nvml", error=f"NVML failed: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _optional(nvml: Any, call: Callable[[], Any]) -> Any:
    """A field a device may not support (utilisation under MIG): None then."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _read_devices(nvml: Any) -> GpuInventory:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    bus = {_text(nvml.nvmlDeviceGetPciInfo(h).busId).lower(): i for i, h in enumerate(handles)}
    devices = []
    for index, handle in enumerate(handles):
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        rates = _optional(nvml, partial(nvml.nvmlDeviceGetUtilizationRates, handle))
        devices.append(
            GpuDevice(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle))[:256],
                memory_bytes=int(memory.total),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                memory_free_bytes=int(memory.free),
                utilization=None if rates is None else int(rates.gpu),
                mig=_mig_devices(nvml, handle),
                nvlink_peers=_nvlink_peers(nvml, handle, bus),
            )
        )
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    return GpuInventory(tuple(devices), "nvml", driver)


def _mig_devices(nvml: Any, handle: Any) -> tuple[MigDevice, ...] | None:
    mode = _optional(nvml, lambda: nvml.nvmlDeviceGetMigMode(handle))
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    found = []
    for position in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = _optional(nvml, partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, position))
        if mig is None:
            continue
        found.append(
            MigDevice(
                gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
            )
        )
    return tuple(found)


def _nvlink_peers(nvml: Any, handle: Any, bus: dict[str, int]) -> tuple[int, ...] | None:
    peers: list[int] = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        state = _optional(nvml, partial(nvml.nvmlDeviceGetNvLinkState, handle, link))
        if state is None:
            break  # links are numbered from 0; the first unsupported one ends them
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        remote = _optional(nvml, partial(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link))
        peer = None if remote is None else bus.get(_text(remote.busId).lower())
        if peer is not None and peer not in peers:
            peers.append(peer)
    return tuple(sorted(peers)) if peers else None


# -- discovery ------------------------------------------------------------------------------


async def discover_gpus(binary: str = "nvidia-smi") -> GpuInventory:
    """NVML, then ``nvidia-smi``; an empty inventory when neither is installed.

    An NVML failure with a working ``nvidia-smi`` is not an error (the fallback is
    what it is for); both failing report the first failure.
    """
    nvml = await trio.to_thread.run_sync(read_nvml)
    if nvml is not None and nvml.error is None:
        return nvml
    smi = await query_nvidia_smi(binary)
    if smi is not None and smi.error is None:
        return smi
    failed = nvml or smi
    if failed is not None:
        log.warning("GPU discovery failed; reporting no GPUs: %s", failed.error)
        return failed
    return GpuInventory()


class GpuDiscovery:
    """The node's inventory, discovered again at most every ``refresh`` seconds.

    :param skip: report no GPUs without looking (agent settings ``skip_gpus``).
    """

    def __init__(
        self,
        *,
        skip: bool = False,
        refresh: float = REFRESH,
        discover: Callable[[], Any] = discover_gpus,
    ) -> None:
        self.skip = skip
        self.refresh = refresh
        self._discover = discover
        self._last: GpuInventory | None = None
        self._at = 0.0

    async def inventory(self) -> GpuInventory:
        if self.skip:
            return GpuInventory()
        now = trio.current_time()
        if self._last is None or now - self._at >= self.refresh:
            self._last, self._at = await self._discover(), now
        return self._last

    async def devices(self) -> tuple[GpuDevice, ...]:
        return (await self.inventory()).devices


async def query_gpus(binary: str = "nvidia-smi") -> tuple[GpuDevice, ...]:
    """The node's GPUs (no error detail): :func:`discover_gpus`'s devices."""
    return (await discover_gpus(binary)).devices


def visible_devices(limits: ResourceLimits | None, devices: Iterable[GpuDevice]) -> dict[str, str]:
    """The environment that shows an engine exactly its reserved GPUs.

    On a node with GPUs, a replica that reserved none sees none (an engine that finds a
    GPU uses it, unreserved). Devices are named by UUID where discovery knows it; by
    index otherwise, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA counts as NVML does.
    Nothing is set on a node without GPUs.
    """
    known = {device.index: device for device in devices}
    if not known:
        return {}
    reserved = [gpu.index for gpu in (limits.gpus if limits is not None else ())]
    names = [(known[i].uuid if i in known else None) or str(i) for i in reserved]
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(names)}


__all__ = [
    "GpuDiscovery",
    "GpuInventory",
    "discover_gpus",
    "parse_nvidia_smi_xml",
    "parse_topology",
    "query_gpus",
    "read_nvml",
    "visible_devices",
]
