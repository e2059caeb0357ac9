"""Two controllers on one store: one leads and drives the services; the standby serves.

Real components throughout: one SQLite file and blob directory shared by two
``open_service`` controllers served on loopback, and a real remote agent running the
stand-in engine, connected to both.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from ficc_core.base.errors import StoreUnavailable
from ficc_core.controller.follower import RoutingFollower
from ficc_core.inference import repository

from ..conftest import bearer
from ..support.lease_support import open_pair, serve
from ..support.serve_support import ServeProcess
from ..support.waiting import eventually

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


class FailingStore:
    """A store that cannot be reached."""

    async def read(self, fn):
        raise StoreUnavailable("the database is down")


@pytest.mark.deadline(70)
async def test_two_controllers_on_one_store_have_exactly_one_leader(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a = await serve(nursery, tmp_path, "ctl-a")
            b = await serve(nursery, tmp_path, "ctl-b")
            leases = [a.controller.service.lease, b.controller.service.lease]
            assert [lease.leading for lease in leases] == [True, False]
            assert a.controller.service.reconciler.running
            assert not b.controller.service.reconciler.running
            # Both list the same installation.
            for served in (a, b):
                view = await served.controller.ok("GET", "/api/v1/system/controllers")
                assert view["leader"]["id"] == "ctl-a" and view["term"] == 1
                assert view["leader"]["url"] == a.controller.url
                assert {c["id"]: c["role"] for c in view["controllers"]} == {
                    "ctl-a": "leader",
                    "ctl-b": "standby",
                }
            assert (await b.controller.ok("GET", "/api/v1/system/controllers"))["this"] == {
                "id": "ctl-b",
                "role": "standby",
                "term": 1,
            }
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_the_standby_takes_over_when_the_leader_ends_and_the_old_one_returns_as_standby(
    tmp_path: Path,
) -> None:
    lease, renew = 1.5, 0.3
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a = await serve(nursery, tmp_path, "ctl-a")
            b = await serve(nursery, tmp_path, "ctl-b")
            b_lease = b.controller.service.lease
            ended = trio.current_time()
            await a.end()
            await eventually(lambda: b_lease.leading, None, every=0.02)
            assert trio.current_time() - ended <= lease + renew
            assert b_lease.term == 2
            await eventually(lambda: b.controller.service.reconciler.running, None, every=0.02)
            again = await serve(nursery, tmp_path, "ctl-a")
            assert not again.controller.service.lease.leading
            assert again.controller.service.lease.term == 2
            assert not again.controller.service.reconciler.running
            view = await again.controller.ok("GET", "/api/v1/system/controllers")
            assert view["leader"]["id"] == "ctl-b" and view["this"]["role"] == "standby"
            await b.end()
            await eventually(lambda: again.controller.service.lease.leading, None, every=0.02)
            assert again.controller.service.lease.term == 3
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(100)
async def test_the_standby_refuses_a_move_naming_the_leader_and_serves_invoke(
    tmp_path: Path,
) -> None:
    with trio.fail_after(90):
        async with open_pair(tmp_path) as pair:
            a, b = pair.a.controller, pair.b.controller
            # Created and started through the standby: the leader notices and drives it.
            created = await b.ok("POST", "/api/v1/inference", status=201, json=await pair.spec())
            service_id = created["id"]
            assert (await b.control(service_id, "start")).status_code == 200
            await a.wait_service(service_id, lambda v: v["state"] == "ready")
            # The standby's routing table follows the store.
            live = b.service.live
            await eventually(
                lambda: live.get(service_id) and live.get(service_id).replicas, None, every=0.05
            )
            issued = await b.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 60}
            )
            token = issued["token"]
            path = f"/api/v1/inference/{service_id}/v1/chat/completions"
            response = await b.http.post(path, headers=bearer(token), json=CHAT)
            assert response.status_code == 200, response.text

            # A read that fails keeps the last table: the replica is still routed.
            routed = live.get(service_id)
            follower = RoutingFollower(
                FailingStore(),
                live=live,
                contributors=b.service.contributors,
                reconciler=b.service.reconciler,
                interval=1,
            )
            assert not await follower.refresh()
            assert live.get(service_id) is routed

            move = await b.call(
                "POST",
                f"/api/v1/inference/{service_id}/replicas/0/move",
                json={"target_node_id": "node-2"},
            )
            assert move.status_code == 409, move.text
            error = move.json()["error"]
            assert error["code"] == "not_leader"
            assert error["details"]["leader"] == {"id": "ctl-a", "url": a.url}
            assert error["details"]["term"] == 1
            # So is what else runs in process with the leader's workers.
            for leader_only in (
                f"/api/v1/models/{pair.model_id}/acquire",
                f"/api/v1/inference/{service_id}/pin",
                f"/api/v1/inference/{service_id}/restart",
            ):
                refused = await b.call("POST", leader_only, json={"revision": 1})
                assert refused.status_code == 409, refused.text
                assert refused.json()["error"]["code"] == "not_leader"

            # The leader ends: invoke through the standby goes on, then it takes over and
            # adopts the running attempt instead of launching another.
            await pair.a.end()
            response = await b.http.post(path, headers=bearer(token), json=CHAT)
            assert response.status_code == 200, response.text
            await eventually(lambda: b.service.lease.leading, None, every=0.02)
            response = await b.http.post(path, headers=bearer(token), json=CHAT)
            assert response.status_code == 200, response.text
            await b.wait_service(service_id, lambda v: v["state"] == "ready")
            attempts = await b.service.store.read(lambda tx: repository.attempts(tx, service_id))
            assert len(attempts) == 1 and not attempts[0].released


@pytest.mark.deadline(100)
async def test_a_request_through_the_standby_wakes_an_idle_on_demand_service(
    tmp_path: Path,
) -> None:
    """The standby records the wake-up (the autoscaler's durable decision); the leader
    launches; the standby's table follows and the waiting request is served."""
    with trio.fail_after(90):
        async with open_pair(tmp_path) as pair:
            a, b = pair.a.controller, pair.b.controller
            spec = {**await pair.spec(), "scaling": {"min": 0}}
            service_id = (await a.ok("POST", "/api/v1/inference", status=201, json=spec))["id"]
            assert (await a.control(service_id, "start")).status_code == 200
            await b.wait_service(service_id, lambda v: v["state"] == "idle")
            live = b.service.live
            await eventually(
                lambda: live.get(service_id) and live.get(service_id).activation == "idle",
                None,
                every=0.05,
            )
            issued = await b.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 60}
            )
            response = await b.http.post(
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                headers=bearer(issued["token"]),
                json=CHAT,
            )
            assert response.status_code == 200, response.text
            assert not b.service.lease.leading
            reasons = [
                e["reason"]
                for e in (await a.ok("GET", f"/api/v1/inference/{service_id}/events"))["events"]
            ]
            assert "activation" in reasons


def _config(folder: Path, name: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(
        f'controller_id = "{name}"\nembedded_agent = false\nleader_lease = "1.5s"\n'
        'leader_renew_interval = "300ms"\nfollow_interval = "200ms"\n'
    )
    return path


@pytest.mark.slow
@pytest.mark.deadline(40)
async def test_a_killed_leader_process_is_replaced_within_lease_and_renewal(
    tmp_path: Path,
) -> None:
    """Two real `ficc serve` processes on one data directory; SIGKILL the leader (no
    release): the standby leads within leader_lease + leader_renew_interval."""
    data = tmp_path / "data"
    a = ServeProcess(data, config=_config(tmp_path, "ctl-a"))
    b = again = None
    try:
        await a.wait_ready()
        token = await a.admin_token()
        b = ServeProcess(data, config=_config(tmp_path, "ctl-b"))
        url_b = await b.wait_ready()
        with trio.fail_after(10):
            said = await b.read_until(r"controller ctl-b: (standby[^\n]*)")
        assert "leader is ctl-a" in said
        async with httpx.AsyncClient(base_url=url_b, headers=bearer(token)) as http:
            killed = trio.current_time()
            a.kill()
            with trio.fail_after(10):
                while True:
                    view = (await http.get("/api/v1/system/controllers")).json()
                    if view["this"]["role"] == "leader":
                        break
                    await trio.sleep(0.05)
            elapsed = trio.current_time() - killed
            assert elapsed <= 1.5 + 0.3 + 0.5, elapsed  # a poll's slack beyond the bound
            assert view["term"] == 2 and view["leader"]["id"] == "ctl-b"
        again = ServeProcess(data, config=_config(tmp_path, "ctl-a"))
        await again.wait_ready()
        with trio.fail_after(10):
            said = await again.read_until(r"controller ctl-a: (standby[^\n]*)")
        assert "leader is ctl-b" in said and "term 2" in said
    finally:
        for process in (a, b, again):
            if process is not None:
                process.kill()
