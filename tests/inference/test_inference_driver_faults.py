"""An unexpected exception in one service's driver is contained to that service.

A real controller with the embedded node runs two services of the stand-in
``vllm`` engine; the reconciler's step raises a ``RuntimeError`` for one of them
until the test lets it go.
"""

from __future__ import annotations

import logging

import pytest
import trio

from ..support.inference_support import open_inference_controller
from .test_inference_directory_models import chat, register_tiny_hf, vllm_spec, write_fake_vllm


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_one_services_unexpected_exception_is_shown_retried_and_leaves_the_rest_serving(
    tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.ERROR, logger="ficc.inference")
    engine, settings, files = write_fake_vllm(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            model = await register_tiny_hf(controller, files)
            services = {}
            for alias in ("faulty", "healthy"):
                spec = await vllm_spec(controller, model["id"], engine, alias=alias)
                created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
                services[alias] = created["id"]
            faulty, healthy = services["faulty"], services["healthy"]

            reconciler = controller.service.reconciler
            original = reconciler._step
            faulting = True
            raised = 0

            async def step(service_id, driver, nursery):
                nonlocal raised
                if service_id == faulty and faulting:
                    raised += 1
                    raise RuntimeError("injected fault")
                return await original(service_id, driver, nursery)

            monkeypatch.setattr(reconciler, "_step", step)
            for service_id in (faulty, healthy):
                assert (await controller.control(service_id, "start")).status_code == 200

            # The faulty service shows the fault and is retried after a doubling wait.
            shown = await controller.wait_service(
                faulty, lambda v: v["reason"] and "retrying in 2 s" in v["reason"]
            )
            assert shown["state"] == "starting"
            assert shown["reason"] == (
                "internal error in the controller while driving this service "
                "(RuntimeError: injected fault); retrying in 2 s"
            )
            assert raised == 2
            # Logged with its traceback.
            [record, *_] = [r for r in caplog.records if r.exc_info]
            assert "injected fault" in caplog.text and "Traceback" in caplog.text
            assert faulty in record.getMessage()

            # Meanwhile the other service comes up and serves; the API answers.
            ready = await controller.wait_service(
                healthy, lambda v: v["state"] in ("ready", "failed")
            )
            assert ready["state"] == "ready", ready
            assert (await chat(controller, healthy)).status_code == 200
            assert raised >= 2
            listed = await controller.ok("GET", "/api/v1/inference")
            assert {faulty, healthy} <= {s["id"] for s in listed["services"]}

            # Once the fault stops, the faulty service recovers: ready, no reason, serving.
            faulting = False
            recovered = await controller.wait_service(
                faulty, lambda v: v["state"] in ("ready", "failed")
            )
            assert recovered["state"] == "ready", recovered
            assert recovered["reason"] is None
            assert (await chat(controller, faulty)).status_code == 200

            # A fault in one of its replica tasks is contained the same way: the driver
            # starts again and watches the running attempt (no new engine is launched).
            attempt = recovered["replicas"][0]["attempt_id"]
            status = controller.service.contributors.status
            watch_faults = 0

            async def faulty_status(node_id, fence):
                nonlocal watch_faults
                if fence.attempt_id.startswith(faulty) and watch_faults == 0:
                    watch_faults += 1
                    raise RuntimeError("injected replica fault")
                return await status(node_id, fence)

            monkeypatch.setattr(controller.service.contributors, "status", faulty_status)
            await controller.wait_service(
                faulty, lambda v: v["reason"] and "injected replica fault" in v["reason"]
            )
            again = await controller.wait_service(faulty, lambda v: v["reason"] is None)
            assert (again["state"], again["replicas"][0]["attempt_id"]) == ("ready", attempt)
            assert (await chat(controller, faulty)).status_code == 200
            assert (await chat(controller, healthy)).status_code == 200
