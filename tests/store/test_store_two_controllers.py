"""Two controllers on one PostgreSQL database, served over HTTP, racing for the last GPU
memory of one node: the store's write lock places the submits one after the other, so
the node is never over-committed, whichever controller each submit reaches."""

from __future__ import annotations

import pytest
import trio

from ..inference.test_inference_api import GIB, _gpu_node, _placement, _spec, _tiny_model
from ..support.inference_support import open_inference_controller


@pytest.mark.deadline(100)
async def test_submits_on_two_controllers_never_over_commit_the_last_gpu_memory(tmp_path, pg_url):
    with trio.fail_after(90):
        async with (
            # One data directory: the controllers of one installation share its blobs.
            open_inference_controller(tmp_path, embedded=False, database_url=pg_url) as a,
            open_inference_controller(tmp_path, embedded=False, database_url=pg_url) as b,
        ):
            await _gpu_node(a, "gpu-1", gpus=(80 * GIB,))
            model_id = await _tiny_model(a)
            outcomes: dict[str, int] = {}

            async def submit(controller, alias: str) -> None:
                spec = _spec(
                    model_id,
                    _placement("gpu-1", cpus=0.5, memory=GIB, gpus=[(0, 20 * GIB)]),
                    alias=alias,
                )
                response = await controller.call("POST", "/api/v1/inference", json=spec)
                outcomes[alias] = response.status_code
                if response.status_code == 409:
                    assert response.json()["error"]["code"] == "placement_failed"

            async with trio.open_nursery() as nursery:
                for index in range(6):  # 80 GiB: four of twelve 20 GiB submits fit
                    nursery.start_soon(submit, a, f"a-{index}")
                    nursery.start_soon(submit, b, f"b-{index}")
            assert sorted(outcomes.values()) == [201] * 4 + [409] * 8, outcomes
            # Both controllers see the same four reservations.
            for controller in (a, b):
                node = await controller.node("gpu-1")
                held = sorted(r["gpus"][0]["memory_bytes"] for r in node["reservations"])
                assert held == [20 * GIB] * 4
