"""GPUs as ``nvidia-smi`` reports them; none when the binary is absent or says nothing usable."""

from __future__ import annotations

import logging
import shutil

import trio

from ..schema import GpuDevice

log = logging.getLogger("ficc.agent")

NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")
#: nvidia-smi can hang when a driver is wedged; a node without GPU facts still works.
NVIDIA_SMI_TIMEOUT = 10.0


def parse_nvidia_smi(text: str) -> tuple[GpuDevice, ...]:
    """Parse ``index, name, memory.total`` lines (MiB, no units) into devices.

    Lines that do not parse (driver warnings, ``[N/A]`` memory, repeated indexes)
    are skipped rather than failing the whole snapshot. Names may contain commas:
    the first field is the index and the last the memory, the rest is the name.
    """
    devices: dict[int, GpuDevice] = {}
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 3:
            continue
        index_text, memory_text, name = fields[0], fields[-1], ", ".join(fields[1:-1])
        try:
            index = int(index_text)
            memory_mib = float(memory_text)
        except ValueError:
            continue
        if index < 0 or memory_mib < 0 or not name or index in devices:
            continue
        try:
            devices[index] = GpuDevice(
                index=index, name=name[:256], memory_bytes=int(memory_mib * 1024 * 1024)
            )
        except ValueError:
            continue
    return tuple(devices[index] for index in sorted(devices))


async def query_gpus(binary: str = "nvidia-smi") -> tuple[GpuDevice, ...]:
    """Ask ``nvidia-smi`` for this node's GPUs; an empty tuple when it is absent or fails."""
    path = shutil.which(binary)
    if path is None:
        return ()
    try:
        with trio.fail_after(NVIDIA_SMI_TIMEOUT):
            result = await trio.run_process(
                [path, *NVIDIA_SMI_QUERY], capture_stdout=True, capture_stderr=True, check=False
            )
    except (OSError, trio.TooSlowError) as exc:
        log.warning("nvidia-smi did not answer (%s); reporting no GPUs", exc)
        return ()
    if result.returncode != 0:
        log.warning("nvidia-smi exited with %s; reporting no GPUs", result.returncode)
        return ()
    return parse_nvidia_smi(result.stdout.decode("utf-8", "replace"))
