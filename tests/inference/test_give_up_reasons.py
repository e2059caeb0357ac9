"""A replica that stopped retrying: the service's reason gives advice that matches the cause
(a memory limit, an engine that exited, a launch the executor refused), never the memory
hint for a failure that has nothing to do with memory."""

from __future__ import annotations

import pytest
import trio

from ficc_core.inference.reconciliation.attempts import log_gist
from ficc_core.inference.reconciliation.publication import give_up_reason
from ficc_core.inference.records import AttemptRecord, AttemptState

from ..support.inference_support import broken_engine, llama_spec, open_inference_controller
from .test_inference_api import _tiny_model

MEMORY_HINT = "preview the specification to see the estimate"
#: What any memory hint, today's or the one before, speaks of.
ESTIMATE = "estimate"


def _attempt(reason: str, message: str, **engine) -> AttemptRecord:
    return AttemptRecord(
        attempt_id="svc_1.r0.g1.a3.abcdef",
        service_id="svc_1",
        replica=0,
        generation=1,
        number=3,
        node_id="local",
        provider="process",
        plan_digest="sha256:" + "0" * 64,
        state=AttemptState.FAILED,
        reason=reason,
        message=message,
        released=True,
        created_at=0.0,
        updated_at=0.0,
        **engine,
    )


def test_only_a_memory_limit_gets_the_memory_hint():
    memory = give_up_reason(
        0, _attempt("memory_limit", "the engine exceeded its memory limit of 1 bytes"), 3
    )
    assert "(memory_limit)" in memory and MEMORY_HINT in memory
    assert "larger memory limit" in memory

    exited = give_up_reason(
        0,
        _attempt("exited", "the engine exited with status 3; its log ends: boom", exit_code=3),
        3,
    )
    assert ESTIMATE not in exited and "memory" not in exited
    assert "the engine exited with status 3" in exited
    assert "ficc inference logs svc_1 --replica 0" in exited

    killed = give_up_reason(1, _attempt("killed", "the engine exited with signal 9", signal=9), 3)
    assert "exited with signal 9: read its log" in killed
    assert "ficc inference logs svc_1 --replica 1" in killed

    refused = give_up_reason(
        0,
        _attempt(
            "launch_failed",
            "the engine socket path /x/engine.sock is longer than 107 bytes; set agent_dir",
        ),
        3,
    )
    assert ESTIMATE not in refused
    assert "set agent_dir" in refused  # the executor's own reason, naming its setting
    assert "the process executor on node local refused to launch the engine" in refused
    assert "change what it names (a setting of the node" in refused

    other = give_up_reason(0, _attempt("readiness_timeout", "never ready"), 3)
    assert ESTIMATE not in other and "ficc inference show svc_1" in other


def test_the_gist_of_a_log_is_its_last_error_else_its_last_line():
    assert log_gist(["loading", "error: no such file", "bye", ""]) == "error: no such file"
    assert log_gist(["loading", "  bye  ", "   "]) == "bye"
    assert log_gist(["", " "]) is None
    assert log_gist(["x" * 1000]).endswith("...") and len(log_gist(["x" * 1000])) == 240


async def _started_until_it_gives_up(controller, executable: str) -> tuple[str, str]:
    """Start a service of the tiny model whose engine is ``executable``; wait until it
    stops retrying and return its ID and reason."""
    model_id = await _tiny_model(controller)
    spec = await llama_spec(controller, model_id)
    spec["image_executable"] = executable
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    service_id = created["id"]
    assert (await controller.control(service_id, "start")).status_code == 200
    view = await controller.wait_service(service_id, lambda v: v["stopped_retrying"])
    return service_id, view["reason"]


@pytest.mark.deadline(70)
async def test_an_engine_that_exits_stops_retrying_with_its_status_log_and_logs_command(
    tmp_path,
):
    """The real engine path: a runtime that prints why and exits 3 on every launch."""
    engine, settings = broken_engine(tmp_path)
    with trio.fail_after(60):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), replica_retry_max="1s", replica_give_up_after=2
        ) as controller:
            service_id, reason = await _started_until_it_gives_up(controller, str(engine))
            assert "its last 2 attempts failed the same way (exited)" in reason
            assert "the engine exited with status 3; its log ends: cannot load the model" in reason
            assert f"ficc inference logs {service_id} --replica 0" in reason
            assert ESTIMATE not in reason and "memory" not in reason
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/status")
            assert "its log ends: cannot load the model" in str(status)


@pytest.mark.deadline(70)
async def test_a_launch_the_executor_refuses_stops_retrying_with_its_reason_and_no_memory_hint(
    tmp_path,
):
    """The real launch path: the specification names an engine executable the node's
    process executor refuses to launch."""
    _, settings = broken_engine(tmp_path)
    with trio.fail_after(60):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), replica_retry_max="1s", replica_give_up_after=2
        ) as controller:
            _, reason = await _started_until_it_gives_up(controller, "no-such-llama-server")
            assert ESTIMATE not in reason and "memory" not in reason
            assert "(launch_failed): 'no-such-llama-server' is not on the job's PATH" in reason
            assert "the process executor on node local refused to launch the engine" in reason
            assert "the specification's runtime" in reason
