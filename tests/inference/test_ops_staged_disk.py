"""A node's staged copy of a model is counted once, whichever replicas come and go.

Two real nodes (tests/support/ops_support.py); node-2 is remote, so it stages the model and
reserves disk for it. Its free disk is steered to room for one copy, not two.
"""

from __future__ import annotations

import logging

import attrs
import pytest
import trio

from ficc_core.inference import repository
from ficc_core.routing.demand import Demand

from ..support.ops_support import open_two_nodes

FAST = {"scale_cooldown": "0s", "scale_out_window": "1s", "heartbeat_interval": "200ms"}


@pytest.mark.deadline(130)
async def test_scaling_out_onto_a_node_that_holds_the_model_needs_no_more_disk(
    tmp_path, monkeypatch, caplog
):
    # The scale-out reserved the model's size again for the copy the node already
    # had, and was refused for want of disk.
    from ficc_core.agent import agent as agent_module

    measured = agent_module.measure_resources
    disk: dict[str, int] = {}

    def measure(state_dir):
        found = measured(state_dir)
        return found if "free" not in disk else attrs.evolve(found, disk_free_bytes=disk["free"])

    monkeypatch.setattr(agent_module, "measure_resources", measure)
    caplog.set_level(logging.WARNING, logger="ficc.inference")
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, **FAST) as ops:
            controller = ops.controller
            spec = await ops.spec("node-2", "node-2")
            spec["scaling"] = {"min": 1, "max": 2}
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")

            async def disks() -> list[tuple[int, int]]:
                held = await controller.service.store.read(
                    lambda tx: repository.reservations(tx, service_id)
                )
                return sorted((r.replica, r.disk_bytes) for r in held)

            [(replica, size)] = await disks()
            assert replica == 0 and size > 0
            disk["free"] = size + size // 2
            node = await controller.node("node-2")
            while node["snapshot"]["resources"]["disk_free_bytes"] != disk["free"]:
                await trio.sleep(0.05)
                node = await controller.node("node-2")

            autoscaler = controller.service.inference.autoscaler
            autoscaler.board.serve(lambda _id: Demand(waits=(5.0,) * 12))  # twelve waiting 5 s
            while True:
                view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
                if view["scaling"]["active"] == [0, 1]:
                    break
                refused = [r.getMessage() for r in caplog.records if "cannot scale" in r.message]
                assert not refused, refused
                with trio.move_on_after(0.2):  # or a refusal, which changes no view
                    await controller.service.live.changed(service_id).wait()
            assert await disks() == [(0, size), (1, 0)]
