"""A real service's history: every change of the service and its attempts is an event,
a relaunched replica says how its previous attempt ended, and the events route pages
it with a cursor (scopes, another project's service, bounded limits)."""

from __future__ import annotations

import logging

import pytest
import trio

from ficc_core.auth import ALL_SCOPES

from ..conftest import issue_token
from ..inference.test_inference_api import _tiny_model
from ..support.inference_support import broken_engine, llama_spec, open_inference_controller


def _stopped(view: dict) -> bool:
    return view["state"] == "stopped" and view["desired"] == "stopped"


async def _gave_up(controller, service_id: str) -> None:
    """Wait until its second attempt failed too, the replica stopped retrying
    (give_up_after 2) and the service's last event says so: nothing changes after."""
    while True:
        events = (await _events(controller, service_id))["events"]
        last = events[-1] if events else {"kind": None}
        if last["kind"] == "service.state" and "stopped retrying" in (
            last["details"]["reason"] or ""
        ):
            return
        await trio.sleep(0.05)


async def _control(controller, service_id: str, action: str) -> None:
    """A control action at the current revision; read again when a write moved it between."""
    for _ in range(5):
        response = await controller.control(service_id, action)
        if response.status_code != 409 or "stale_revision" not in response.text:
            break
    assert response.status_code == 200, response.text


async def _events(controller, service_id: str, **params) -> dict:
    return await controller.ok("GET", f"/api/v1/inference/{service_id}/events", params=params)


@pytest.fixture
async def failing(tmp_path):
    """A controller whose embedded node's llama_server always exits 3 at start."""
    engine, settings = broken_engine(tmp_path)
    with trio.fail_after(60):
        async with open_inference_controller(
            tmp_path,
            agent_config=str(settings),
            replica_retry_max="1s",
            replica_give_up_after=2,
        ) as controller:
            model_id = await _tiny_model(controller)
            spec = await llama_spec(controller, model_id)
            spec["image_executable"] = str(engine)
            yield controller, spec


@pytest.mark.deadline(70)
async def test_each_change_of_a_failing_service_is_an_event_and_a_log_line(failing, caplog):
    caplog.set_level(logging.INFO, logger="ficc.events")
    controller, spec = failing
    with trio.fail_after(60):
        created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
        service_id = created["id"]
        assert (await controller.control(service_id, "start")).status_code == 200
        await _gave_up(controller, service_id)
        await _control(controller, service_id, "stop")
        await controller.wait_service(service_id, _stopped)
        await _control(controller, service_id, "remove")
        while (await controller.call("GET", f"/api/v1/inference/{service_id}")).status_code != 404:  # noqa: ASYNC110
            await trio.sleep(0.05)

    # The route answers 404 once the service is gone: read the rows it left.
    from ficc_core.events import repository

    found = await controller.service.store.read(
        lambda tx: repository.for_service(tx, service_id, limit=500)
    )
    kinds = [e.kind for e in found]
    assert kinds[0] == "service.created"
    assert kinds[-1] == "service.removed"
    desired = [(e.reason, e.details["desired"]["to"]) for e in found if e.kind == "service.desired"]
    assert desired == [("start", "running"), ("stop", "stopped"), ("remove", "removed")]
    assert all(e.details["actor"] for e in found if e.kind == "service.desired")

    # Attempt 1 is created, fails (the engine exited), and the replica is relaunched as
    # attempt 2, naming how attempt 1 ended.
    [first] = [e for e in found if e.kind == "attempt.created"]
    assert (first.replica, first.details["number"]) == (0, 1)
    failures = [
        e for e in found if e.kind == "attempt.state" and e.details["state"]["to"] == "failed"
    ]
    assert len(failures) == 2
    assert failures[0].attempt_id == first.attempt_id
    assert failures[0].reason == "exited"
    assert failures[0].details["released"] is True
    [restarted] = [e for e in found if e.kind == "replica.restarted"]
    assert restarted.subject == "replica" and restarted.subject_id == f"{service_id}/0"
    assert restarted.reason == "exited"
    assert restarted.details["number"] == 2
    assert restarted.details["restarts"] == 1
    assert restarted.details["previous"]["attempt_id"] == first.attempt_id
    assert restarted.details["previous"]["reason"] == "exited"
    # The events come in the order of the changes.
    assert found.index(failures[0]) < found.index(restarted) < found.index(failures[1])

    # The service's own states: starting, then failed with the engine's reason.
    failed = [
        e for e in found if e.kind == "service.state" and e.details["state"]["to"] == "failed"
    ]
    assert "exited with status 3" in failed[0].details["reason"]
    assert failed[0].message.startswith("state starting → failed: ")

    # Each event was logged at INFO once its change committed, one line each.
    lines = [r.getMessage() for r in caplog.records if r.name == "ficc.events"]
    assert len(lines) == len(found)
    assert any(
        line.startswith(f"replica.restarted replica {service_id}/0 (exited): replica 0 relaunched")
        for line in lines
    )
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "ficc.events")


@pytest.mark.deadline(70)
async def test_the_events_route_pages_with_a_cursor_and_bounds_its_limit(failing):
    controller, spec = failing
    with trio.fail_after(60):
        created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
        service_id = created["id"]
        assert (await controller.control(service_id, "start")).status_code == 200
        await _gave_up(controller, service_id)

        everything = await _events(controller, service_id, limit=500)
        events = everything["events"]
        assert len(events) >= 8
        ids = [e["id"] for e in events]
        assert ids == sorted(ids)
        assert everything["next_after"] == ids[-1]
        assert events[0]["kind"] == "service.created"
        # The node the attempts ran on: its connection is in the service's history
        # only from the service's creation on (it connected before).
        assert all(e["kind"] != "node.state" for e in events)

        newest = await _events(controller, service_id, limit=3)
        assert [e["id"] for e in newest["events"]] == ids[-3:]
        first = await _events(controller, service_id, after=0, limit=2)
        assert [e["id"] for e in first["events"]] == ids[:2]
        second = await _events(controller, service_id, after=first["next_after"], limit=2)
        assert [e["id"] for e in second["events"]] == ids[2:4]
        done = await _events(controller, service_id, after=ids[-1])
        assert done["events"] == [] and done["next_after"] == ids[-1]
        # Paged back with before (the oldest ID held): the newest limit older than it.
        older = await _events(controller, service_id, before=ids[-3], limit=2)
        assert [e["id"] for e in older["events"]] == ids[-5:-3]
        assert (await _events(controller, service_id, before=ids[0]))["events"] == []
        both = await controller.call(
            "GET", f"/api/v1/inference/{service_id}/events", params={"after": 0, "before": 9}
        )
        assert both.status_code == 400
        assert both.json()["error"]["details"]["errors"][0]["path"] == "before"
        view = events[0]
        assert set(view) == {
            "id", "at", "kind", "subject", "subject_id", "service_id", "node_id",
            "attempt_id", "replica", "reason", "message", "details",
        }  # fmt: skip

        # The node's later state changes are in the service's history (it hosts it).
        await controller.service.contributors.revoke_node("local")
        listed = await _events(controller, service_id, after=ids[-1], limit=500)
        node_events = [e for e in listed["events"] if e["kind"] == "node.state"]
        assert [(e["node_id"], e["reason"]) for e in node_events] == [("local", "revoked")]

        for bad, message in [
            ("0", "must be from 1 to 500"),
            ("501", "must be from 1 to 500"),
            ("ten", "expected a non-negative integer"),
            ("-1", "expected a non-negative integer"),
        ]:
            response = await controller.call(
                "GET", f"/api/v1/inference/{service_id}/events", params={"limit": bad}
            )
            assert response.status_code == 400, bad
            error = response.json()["error"]
            assert error["code"] == "invalid_request"
            assert error["details"]["errors"] == [{"path": "limit", "message": message}]
        response = await controller.call(
            "GET", f"/api/v1/inference/{service_id}/events", params={"after": "x"}
        )
        assert response.status_code == 400
        assert response.json()["error"]["details"]["errors"][0]["path"] == "after"

        # Another project's service does not exist for this caller; a missing scope is 403.
        await controller.service.auth.create_project("elsewhere")
        stranger = await issue_token(controller.service, project="elsewhere", scopes=ALL_SCOPES)
        response = await controller.call(
            "GET", f"/api/v1/inference/{service_id}/events", token=stranger
        )
        assert (response.status_code, response.json()["error"]["code"]) == (
            404,
            "service_not_found",
        )
        unscoped = await issue_token(
            controller.service,
            scopes=[scope for scope in ALL_SCOPES if scope != "inference:read"],
            name="no-read",
        )
        response = await controller.call(
            "GET", f"/api/v1/inference/{service_id}/events", token=unscoped
        )
        assert response.status_code == 403


@pytest.mark.deadline(70)
async def test_the_cli_lists_follows_and_shows_the_recent_events(failing, monkeypatch):
    from types import SimpleNamespace

    from ficc_core.cli import inference_events

    from ..cli.test_cli_inference import Cli

    controller, spec = failing
    cli = Cli(controller.url, controller.token)
    with trio.fail_after(60):
        created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
        service_id = created["id"]
        assert (await controller.control(service_id, "start")).status_code == 200
        await _gave_up(controller, service_id)
        listed = (await controller.ok("GET", f"/api/v1/inference/{service_id}/events"))["events"]

        # By alias; the newest --limit, oldest first, as a table.
        table = (await cli.ok("events", "smol", "--limit", "3")).stdout.splitlines()
        assert table[0].split() == ["TIME", "KIND", "SUBJECT", "REASON", "MESSAGE"]
        assert [line.split()[2] for line in table[1:]] == [e["kind"] for e in listed[-3:]]
        page = await cli.json("events", "smol", "--after", str(listed[0]["id"]), "--limit", "2")
        assert [e["id"] for e in page["events"]] == [e["id"] for e in listed[1:3]]

        # `show` ends with the last few.
        shown = (await cli.ok("show", "smol")).stdout
        recent = shown.split("recent events (", 1)[1].splitlines()
        assert len(recent) == 1 + 1 + 5  # the title, the header, five events
        assert listed[-1]["message"] in recent[-1]

        # --follow prints what happens next (a stop here), until interrupted.
        naps: list[float] = []

        def nap(seconds: float) -> None:
            naps.append(seconds)
            if len(naps) > 1:
                raise KeyboardInterrupt
            trio.from_thread.run(_control, controller, service_id, "stop")
            trio.from_thread.run(controller.wait_service, service_id, _stopped)

        monkeypatch.setattr(inference_events, "time", SimpleNamespace(sleep=nap))
        followed = await cli.ok("events", "smol", "--limit", "1", "--follow", "--interval", "0.5")
        lines = followed.stdout.splitlines()
        assert naps == [0.5, 0.5]
        assert lines[1].split()[2] == listed[-1]["kind"]  # the newest one, then the news
        assert any(" service.desired " in f" {line} " and " stop" in line for line in lines[2:])
        assert lines[-1].split()[2] == "service.state"
