"""A replica's log on the embedded node: the snapshot, tickets, and the live stream."""

from __future__ import annotations

import json
import time
from contextlib import aclosing

import pytest
import trio

from ..cli.test_cli_inference import Cli
from ..support.inference_support import llama_spec, open_inference_controller
from ..support.logs_support import STARTUP_LINES, logging_engine, settled_log, sse_items, tiny_model
from ..support.waiting import eventually


def _agent(controller):
    return controller.service.contributors.live.link("local").agent


async def _service(controller, engine) -> str:
    spec = await llama_spec(controller, await tiny_model(controller))
    spec["image_executable"] = str(engine)
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    return created["id"]


async def _start(controller, service_id: str) -> dict:
    assert (await controller.control(service_id, "start")).status_code == 200
    view = await controller.wait_service(service_id, lambda view: view["state"] == "ready")
    await settled_log(controller, service_id)
    return view


async def _ticket(controller, service_id: str, replica: int = 0) -> str:
    minted = await controller.ok(
        "POST", f"/api/v1/inference/{service_id}/replicas/{replica}/logs/ticket"
    )
    assert 59 <= minted["expires_at"] - time.time() <= 61
    return minted["ticket"]


@pytest.mark.deadline(100)
async def test_the_snapshot_names_the_attempt_and_refuses_what_it_cannot_read(tmp_path):
    engine, settings = logging_engine(tmp_path)
    with trio.fail_after(90):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            service_id = await _service(controller, engine)
            logs = f"/api/v1/inference/{service_id}/replicas/0/logs"

            # Never started: nothing to read, said in the seed's terms.
            response = await controller.call("GET", logs)
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "replica_not_started"
            assert error["details"] == {
                "action": "logs",
                "service": "smol",
                "replica": 0,
                "node": "local",
                "reason": "replica_not_started",
            }
            ticket = await controller.call("POST", logs + "/ticket")
            assert ticket.status_code == 422

            view = await _start(controller, service_id)
            found = await controller.ok("GET", logs, params={"tail": 5})
            assert len(found["lines"]) == 5
            assert found["node_id"] == "local"
            assert found["attempt_id"] == view["replicas"][0]["attempt_id"]
            everything = (await controller.ok("GET", logs, params={"tail": 1000}))["lines"]
            assert everything[:STARTUP_LINES] == [
                f"fake llama-server line {n}" for n in range(STARTUP_LINES)
            ]
            assert found["lines"] == everything[-5:]
            assert len((await controller.ok("GET", logs))["lines"]) == min(100, len(everything))

            for tail in ("0", "1001", "-1", "ten", "1e3"):
                response = await controller.call("GET", logs, params={"tail": tail})
                assert response.status_code == 400, tail
                assert response.json()["error"]["details"]["errors"][0]["path"] == "tail"
            response = await controller.call("GET", logs.replace("/replicas/0/", "/replicas/1/"))
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "replica_not_found"
            response = await controller.call("GET", "/api/v1/inference/nope/replicas/0/logs")
            assert response.json()["error"]["code"] == "service_not_found"


@pytest.mark.deadline(130)
async def test_a_ticket_opens_the_live_stream_once_and_it_ends_with_the_attempt(tmp_path):
    engine, settings = logging_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), log_keepalive="200ms"
        ) as controller:
            service_id = await _service(controller, engine)
            attempt_id = (await _start(controller, service_id))["replicas"][0]["attempt_id"]
            stream = f"/api/v1/inference/{service_id}/replicas/0/logs/stream"
            logs = f"/api/v1/inference/{service_id}/replicas/0/logs"
            tail = (await controller.ok("GET", logs, params={"tail": 3}))["lines"]
            ticket = await _ticket(controller, service_id)

            # A bearer credential alone does not open it; the ticket does, once.
            response = await controller.call("GET", stream)
            assert response.status_code == 401
            assert response.json()["error"]["details"]["reason"] == "missing"
            foreign = await controller.call(
                "GET", "/api/v1/inference/other/replicas/0/logs/stream", params={"ticket": ticket}
            )
            assert foreign.status_code == 401
            assert foreign.json()["error"]["details"]["reason"] == "another_stream"

            http = controller.http
            params = {"ticket": ticket, "tail": 3}
            async with http.stream("GET", stream, params=params) as opened:
                assert opened.status_code == 200
                assert opened.headers["content-type"].startswith("text/event-stream")
                again = await http.get(stream, params=params)
                assert again.status_code == 401
                assert again.json()["error"]["code"] == "ticket_invalid"
                assert again.json()["error"]["details"]["reason"] == "used"
                seen: list[tuple[str, str]] = []
                async with aclosing(sse_items(opened)) as items:
                    async for kind, value in items:
                        seen.append((kind, value))
                        if kind == "comment" and sum(k == "comment" for k, _ in seen) == 2:
                            # The attempt ends: the stream says so and closes.
                            assert (await controller.control(service_id, "stop")).status_code
                        if kind == "end":
                            break
            data = [value for kind, value in seen if kind == "data"]
            assert data[:3] == tail
            assert seen[3] == ("comment", "keepalive")
            # New lines arrive live: the engine's own words as it is stopped.
            assert "standin engine stopping" in data[3:]
            assert seen[-1][0] == "end"
            assert json.loads(seen[-1][1]) == {"attempt_id": attempt_id, "reason": "attempt_ended"}
            with trio.fail_after(10):
                await eventually(lambda: not _agent(controller).open_follows, None, every=0.02)


@pytest.mark.deadline(130)
async def test_an_expired_ticket_is_refused_and_a_closed_client_ends_the_node_s_follow(tmp_path):
    engine, settings = logging_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            service_id = await _service(controller, engine)
            await _start(controller, service_id)
            stream = f"/api/v1/inference/{service_id}/replicas/0/logs/stream"

            expired = await _ticket(controller, service_id)
            await controller.service.store.write(  # as 60 s passing would
                lambda tx: tx.execute(
                    "UPDATE stream_tickets SET expires_at = ?", (time.time() - 1,)
                )
            )
            response = await controller.http.get(stream, params={"ticket": expired})
            assert response.status_code == 401
            assert response.json()["error"]["details"]["reason"] == "expired"

            ticket = await _ticket(controller, service_id)
            agent = _agent(controller)
            async with controller.http.stream(
                "GET", stream, params={"ticket": ticket, "tail": 1}
            ) as opened:
                async with aclosing(sse_items(opened)) as items:
                    kind, _line = await anext(items)
                    assert kind == "data"
                assert agent.open_follows == 1
            # The client went away: the follow ends on the node.
            with trio.fail_after(10):
                await eventually(lambda: not agent.open_follows, None, every=0.02)


@pytest.mark.deadline(130)
async def test_ficc_inference_logs_prints_the_last_lines_and_follows_to_the_end(tmp_path):
    engine, settings = logging_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            service_id = await _service(controller, engine)
            view = await _start(controller, service_id)
            attempt_id = view["replicas"][0]["attempt_id"]
            logs = f"/api/v1/inference/{service_id}/replicas/0/logs"
            lines = (await controller.ok("GET", logs, params={"tail": 3}))["lines"]
            cli = Cli(controller.url, controller.token)

            printed = await cli.ok("logs", "smol", "--tail", "3")
            assert printed.stdout.splitlines() == lines
            assert f"attempt {attempt_id} (ready) on node local" in printed.stderr
            refused = await cli("logs", "smol", "--replica", "4")
            assert refused.exit_code == 1 and "replica_not_found" in refused.stderr
            refused = await cli("logs", "smol", "--tail", "0")
            assert refused.exit_code == 2

            async def stop_once_followed() -> None:
                await eventually(lambda: _agent(controller).open_follows, None, every=0.02)
                assert (await controller.control(service_id, "stop")).status_code == 200

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_once_followed)
                followed = await cli.ok("logs", service_id, "-f", "--tail", "1")
            assert followed.stdout.splitlines()[0] == lines[-1]
            assert "standin engine stopping" in followed.stdout
            assert f"the attempt ended ({attempt_id})" in followed.stderr


@pytest.mark.deadline(130)
async def test_a_revoked_caller_s_stream_ends_with_an_error_event(tmp_path):
    engine, settings = logging_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), log_keepalive="200ms"
        ) as controller:
            service_id = await _service(controller, engine)
            await _start(controller, service_id)
            credential, reader = await controller.service.auth.create_credential(
                "default", name="reader", scopes=frozenset({"inference:read"})
            )
            base = f"/api/v1/inference/{service_id}/replicas/0/logs"
            ticket = (await controller.ok("POST", base + "/ticket", token=reader))["ticket"]
            async with controller.http.stream(
                "GET", base + "/stream", params={"ticket": ticket, "tail": 0}
            ) as opened:
                async with aclosing(sse_items(opened)) as items:
                    assert await anext(items) == ("comment", "keepalive")
                    await controller.ok("DELETE", f"/api/v1/tokens/{credential.id}")
                    ended = [item async for item in items if item[0] != "comment"]
            assert [kind for kind, _ in ended] == ["error"]
            assert json.loads(ended[0][1])["error"]["code"] == "credential_revoked"
            with trio.fail_after(10):
                await eventually(lambda: not _agent(controller).open_follows, None, every=0.02)
