"""Rate limits and budgets through the real gateway (hypercorn, the embedded agent, the
stand-in engine, real SQLite): 60 rpm against a burst of 100, a tpm reservation that
reconciles to the engine's usage, a budget of 1 unit the tenth request crosses, a
store that fails under a running gateway, and a project-endpoint request that falls
back counted once (the gateway's own refusals and the limit's not at all)."""

from __future__ import annotations

import httpx
import pytest
import trio

from ficc_core.config.prices import Price

from ..support.clock import FakeClock
from ..support.gateway_support import chat, gateway_env
from ..support.waiting import eventually
from .test_quotas import T0, FailingStore

URL = "/api/v1/inference/svc/v1/chat/completions"


async def _burst(http: httpx.AsyncClient, count: int, body: dict, workers: int = 4) -> list:
    """``count`` requests, ``workers`` at a time; the responses in the order they ended."""
    responses: list[httpx.Response] = []
    queue = iter(range(count))

    async def worker() -> None:
        for _ in queue:
            responses.append(await http.post(URL, json=body))

    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(worker)
    return responses


@pytest.mark.deadline(130)
async def test_sixty_rpm_a_hundred_requests_in_a_second_sixty_served_forty_refused(tmp_path):
    with trio.fail_after(120):
        async with gateway_env(tmp_path) as env:
            env.service.quotas.clock = FakeClock(T0 + 0.5)  # the whole burst within one second
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=4)
            key, token = await env.token()
            async with env.http(env.admin_token) as admin:
                put = await admin.put(f"/api/v1/tokens/{key}/limits", json={"rpm": 60})
                assert put.status_code == 200, put.text
                assert put.json()["limits"] == {
                    "rpm": 60,
                    "tpm": None,
                    "budget": None,
                    "period": None,
                }
            async with env.http(token) as http:
                responses = await _burst(http, 100, chat(deltas=2))
            statuses = [r.status_code for r in responses]
            assert (statuses.count(200), statuses.count(429)) == (60, 40)
            for refused in (r for r in responses if r.status_code == 429):
                error = refused.json()["error"]
                assert error["code"] == "rate_limited"
                assert error["details"]["limit"] == "rpm"
                assert (error["details"]["scope"], error["details"]["id"]) == ("credential", key)
                assert refused.headers["Retry-After"] == "61"  # when 59 of 60 weigh on
            assert await env.chats_seen(fence) == 60  # refused before a replica was taken
            labels = {"service": "svc", "replica": "", "code": "rate_limited"}
            errors = env.service.metrics.registry.get_sample_value(
                "ficc_gateway_errors_total", labels
            )
            assert errors == 40
            async with env.http(env.admin_token) as admin:
                view = (await admin.get(f"/api/v1/tokens/{key}/limits")).json()
            assert view["use"]["requests"] == 60


@pytest.mark.deadline(70)
async def test_tpm_refuses_an_estimate_that_does_not_fit_and_reconciles_to_usage(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            env.service.quotas.clock = FakeClock(T0 + 1)
            fence = await env.launch()
            env.publish("svc", [fence])
            key, token = await env.token()
            async with env.http(env.admin_token) as admin:
                put = await admin.put(f"/api/v1/tokens/{key}/limits", json={"tpm": 200})
                assert put.status_code == 200, put.text
            meter = None
            async with env.http(token) as http:
                first = await http.post(URL, json=chat(deltas=8, max_tokens=100))
                assert first.status_code == 200, first.text
                usage = first.json()["usage"]
                meter = env.service.quotas.meters[f"credential:{key}"]
                # The estimate (bytes / 4 and max_tokens) gave way to the engine's usage.
                assert meter.tokens == usage["prompt_tokens"] + usage["completion_tokens"]
                # 200 - 12 left: asking for 190 more cannot fit, whatever the prompt.
                refused = await http.post(URL, json=chat(deltas=8, max_tokens=190))
                assert refused.status_code == 429, refused.text
                error = refused.json()["error"]
                assert (error["code"], error["details"]["limit"]) == ("rate_limited", "tpm")
                assert error["details"]["value"] == 200
                assert int(refused.headers["Retry-After"]) >= 1
                streamed = await http.post(URL, json=chat(stream=True, deltas=5, max_tokens=50))
                assert streamed.status_code == 200
            expected = usage["prompt_tokens"] * 2 + usage["completion_tokens"] + 5
            assert meter.tokens == expected
            assert await env.chats_seen(fence) == 2


@pytest.mark.deadline(70)
async def test_a_budget_of_one_unit_serves_nine_and_refuses_the_tenth_spend_exact(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            quotas = env.service.quotas
            quotas.clock = FakeClock(T0 + 1)
            quotas.prices = {"smol": Price(prompt_per_1k=0, completion_per_1k=13)}
            fence = await env.launch()
            env.publish("svc", [fence], model_id="m-1", model_name="smol")
            _, token = await env.token()
            async with env.http(env.admin_token) as admin:
                put = await admin.put(
                    "/api/v1/projects/default/limits", json={"budget": 1, "period": "day"}
                )
                assert put.status_code == 200, put.text
            async with env.http(token) as http:
                statuses = []
                for _ in range(12):
                    response = await http.post(URL, json=chat(deltas=8, max_tokens=8))
                    statuses.append(response.status_code)
            assert statuses == [200] * 9 + [429] * 3
            error = response.json()["error"]
            assert error["code"] == "budget_exceeded"
            assert error["details"]["scope"] == "project"
            assert error["details"]["id"] == env.project_id
            assert (error["details"]["budget"], error["details"]["period"]) == (1, "day")
            assert error["details"]["spent"] == 0.936  # 9 x 8 tokens x 13 / 1000
            resets = (int(T0) // 86400 + 1) * 86400
            assert error["details"]["resets_at"] == resets
            assert response.headers["Retry-After"] == str(resets - int(T0 + 1))
            # The refusals are usage records too, of their code and costing nothing.
            assert [(r.outcome, r.cost) for r in env.gateway.usage] == [("ok", 104)] * 9 + [
                ("budget_exceeded", 0)
            ] * 3
            async with env.http(env.admin_token) as admin:
                view = (await admin.get("/api/v1/projects/default/limits")).json()
            assert view["use"]["spent"] == 0.936 and view["use"]["period"] == "day"
            assert await env.chats_seen(fence) == 9


@pytest.mark.deadline(70)
async def test_a_failing_store_under_a_running_gateway_holds_no_request(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            quotas, sync = env.service.quotas, env.service.quota_sync
            quotas.clock = FakeClock(T0 + 1)
            fence = await env.launch()
            env.publish("svc", [fence])
            key, token = await env.token()
            await quotas.set_limits("credential", key, {"rpm": 5})
            failing = FailingStore(quotas.store)
            failing.failing = True
            quotas.store = failing
            async with env.http(token) as http:
                statuses = [
                    (await http.post(URL, json=chat(deltas=1))).status_code for _ in range(8)
                ]
            assert statuses == [200] * 5 + [429] * 3
            metrics = env.service.metrics.registry
            # The background sync fails every interval meanwhile.
            await eventually(lambda: metrics.get_sample_value("ficc_quota_sync_failures_total"))
            failing.failing = False
            synced = sync.synced
            await eventually(lambda: sync.synced > synced)
            row = await failing.store.read(
                lambda tx: tx.fetch_one(
                    "SELECT requests FROM quota_counters WHERE subject = ?", (f"credential:{key}",)
                )
            )
            assert row == {"requests": 5}


@pytest.mark.deadline(70)
async def test_a_request_that_falls_back_counts_once_and_the_gateways_refusals_not_at_all(
    tmp_path,
):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            env.service.quotas.clock = FakeClock(T0 + 1)
            fence = await env.launch()
            env.publish("svc", [fence], alias="beta")
            env.publish("svc-a", [], alias="alpha", fallbacks=("beta",))  # no ready replica
            key, token = await env.token()
            async with env.http(env.admin_token) as admin:
                put = await admin.put(f"/api/v1/tokens/{key}/limits", json={"rpm": 2})
                assert put.status_code == 200, put.text

                async def used() -> int:
                    view = (await admin.get(f"/api/v1/tokens/{key}/limits")).json()
                    return view["use"]["requests"]

                async with env.http(token) as http:
                    body = chat(model="alpha", deltas=2)
                    response = await http.post("/v1/chat/completions", json=body)
                    assert response.status_code == 200, response.text
                    assert response.headers["x-ficc-service"] == "beta"
                    assert await used() == 1  # alpha gave its request back to beta
                    # The gateway's own refusal after admission is not the client's request.
                    refused = await http.post(
                        "/api/v1/inference/svc-a/v1/chat/completions", json=body
                    )
                    assert refused.json()["error"]["code"] == "no_ready_replica"
                    assert await used() == 1
                    beta = chat(model="beta", deltas=2)
                    assert (await http.post(URL, json=beta)).status_code == 200
                    assert await used() == 2
                    # At the limit: the refusal by the limit is not counted either.
                    limited = await http.post(URL, json=beta)
                    assert limited.json()["error"]["code"] == "rate_limited"
                    assert await used() == 2
            assert await env.chats_seen(fence) == 2


@pytest.mark.deadline(70)
async def test_a_budget_set_or_moved_to_another_period_counts_what_was_spent_in_it(tmp_path):
    """Spend is counted per day and per month at once: a project's day budget moved to a
    month, and a key with no budget given a day's, both count today's spend."""
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            quotas = env.service.quotas
            quotas.clock = FakeClock(T0 + 1)
            quotas.prices = {"smol": Price(prompt_per_1k=0, completion_per_1k=1000)}
            fence = await env.launch()
            env.publish("svc", [fence], model_id="m-1", model_name="smol")
            key, token = await env.token()
            body = chat(deltas=8, max_tokens=8)  # 8 units each

            async def statuses(http: httpx.AsyncClient, count: int) -> list[int]:
                return [(await http.post(URL, json=body)).status_code for _ in range(count)]

            async with env.http(env.admin_token) as admin, env.http(token) as http:
                put = await admin.put(
                    "/api/v1/projects/default/limits", json={"budget": 40, "period": "day"}
                )
                assert put.status_code == 200, put.text
                assert await statuses(http, 6) == [200] * 5 + [429]
                put = await admin.put(
                    "/api/v1/projects/default/limits", json={"budget": 60, "period": "month"}
                )
                assert put.json()["use"]["spent"] == 40 and put.json()["use"]["period"] == "month"
                assert await statuses(http, 4) == [200] * 2 + [429] * 2  # 56; 64 > 60
                error = (await http.post(URL, json=body)).json()["error"]
                assert (error["details"]["spent"], error["details"]["period"]) == (56, "month")
                put = await admin.put(
                    "/api/v1/projects/default/limits", json={"budget": 1000, "period": "month"}
                )
                assert put.status_code == 200, put.text
                # The key spent 56 today with no budget of its own: a day budget of 50
                # refuses its next request at once.
                put = await admin.put(
                    f"/api/v1/tokens/{key}/limits", json={"budget": 50, "period": "day"}
                )
                assert put.json()["use"]["spent"] == 56 and put.json()["use"]["period"] == "day"
                refused = await http.post(URL, json=body)
                assert refused.status_code == 429, refused.text
                error = refused.json()["error"]
                assert (error["code"], error["details"]["scope"]) == (
                    "budget_exceeded",
                    "credential",
                )
                assert (error["details"]["spent"], error["details"]["period"]) == (56, "day")
            assert await env.chats_seen(fence) == 7


@pytest.mark.deadline(70)
async def test_a_quota_refusal_is_recorded_with_the_services_current_generation(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            env.service.quotas.clock = FakeClock(T0 + 1)
            fence = await env.launch()
            env.publish("svc", [fence], generation=3)
            key, token = await env.token()
            async with env.http(env.admin_token) as admin:
                put = await admin.put(f"/api/v1/tokens/{key}/limits", json={"rpm": 1})
                assert put.status_code == 200, put.text
            async with env.http(token) as http:
                assert (await http.post(URL, json=chat(deltas=2))).status_code == 200
                refused = await http.post(URL, json=chat(deltas=2))
                assert refused.status_code == 429, refused.text
                bad = await http.post(
                    URL, content=b"{not json", headers={"content-type": "application/json"}
                )
                assert bad.status_code == 400
            ledger = env.service.usage
            await eventually(lambda: len(env.gateway.usage) == 3)
            await ledger.flush()
            rows = await env.service.store.read(
                lambda tx: tx.fetch_all(
                    "SELECT outcome, status, replica, generation FROM inference_usage"
                    " WHERE credential_id = ? ORDER BY id",
                    (key,),
                )
            )
            # The refused requests would have been served by generation 3, as the first was.
            assert [(r["outcome"], r["status"], r["generation"]) for r in rows] == [
                ("ok", 200, 3),
                ("rate_limited", 429, 3),
                ("invalid_json", 400, 3),
            ]
            assert [r["replica"] for r in rows][1:] == ["", ""]
