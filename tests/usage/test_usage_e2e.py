"""Accounting end to end: a real controller, embedded agent and stand-in engine over HTTP.

Requests keep succeeding while the store refuses usage writes (a wrapper raising on
write: the edge a read-only or full disk is), the buffer's aggregation is counted on
/metrics, and once the store takes writes again the records are there and right.
Refusals after the credential was known (a 429 from the quota gate, a bad body) are
usage too, and ``ficc usage`` prints them by code.
"""

from __future__ import annotations

import json
import os

import pytest
import trio

from ficc_core.base.errors import FiccError

from ..support.gateway_support import chat, gateway_env
from ..support.serve_support import ficc_command
from ..support.waiting import eventually
from .test_usage_ledger import WriteGate


class RefuseAfter:
    """A quota gate (the quotas package's seam) admitting ``n`` requests, then 429."""

    def __init__(self, n: int) -> None:
        self.left = n

    def admit(self, request) -> None:
        if self.left <= 0:
            raise FiccError(
                "the key's requests per minute are used up",
                code="rate_limited",
                status=429,
                headers={"Retry-After": "60"},
            )
        self.left -= 1

    def settle(self, request, outcome, prompt, completion) -> int:
        return 1000 * (prompt or 0) + 2000 * (completion or 0)  # 1 and 2 units per token


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@pytest.mark.deadline(100)
async def test_requests_flow_while_usage_writes_fail_and_the_records_come_back(tmp_path):
    with trio.fail_after(90):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=4)
            credential_id, token = await env.token(name="looped")
            ledger = env.service.usage
            gate = WriteGate(ledger.store)
            ledger.store, ledger.period, ledger.capacity = gate, 0.05, 5
            path = "/api/v1/inference/svc/v1/chat/completions"
            async with env.http(token) as http, env.http(env.admin_token) as admin:
                for _ in range(3):
                    assert (await http.post(path, json=chat(deltas=2))).status_code == 200
                await eventually(lambda: ledger.buffered == 0)
                gate.fail = True
                for _ in range(20):
                    with trio.fail_after(5):  # nothing waits for the store
                        response = await http.post(path, json=chat(deltas=2))
                    assert response.status_code == 200
                await eventually(lambda: gate.failed >= 2)
                metrics = (await admin.get("/metrics")).text
                assert _sample(metrics, "ficc_usage_aggregated_total") == 15
                assert _sample(metrics, "ficc_usage_dropped_total") == 0
                assert _sample(metrics, "ficc_usage_write_failures_total") >= 2
                gate.fail = False  # the writer's next try (after its backoff) succeeds
                await eventually(lambda: ledger.buffered == 0, 40)
                report = (
                    await admin.get("/api/v1/usage", params={"service": "svc", "group_by": "key"})
                ).json()
            [group] = report["groups"]
            assert group["key"] == {"id": credential_id, "name": "looped"}
            assert group["requests"] == 23 and group["errors"] == 0
            assert group["completion_tokens"] == 23 * 2
            assert group["prompt_tokens"] > 0
            assert group["latency"]["duration"]["p50"] is not None


@pytest.mark.deadline(100)
async def test_refusals_after_the_key_was_known_are_usage_by_code(tmp_path):
    with trio.fail_after(90):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=4, model_id="mdl-x")
            gate = RefuseAfter(2)
            env.gateway.quotas = env.gateway.accounting.quotas = gate
            credential_id, token = await env.token(name="busy")
            path = "/api/v1/inference/svc/v1/chat/completions"
            async with env.http(token) as http:
                bad = await http.post(
                    path, content=b"{not json", headers={"content-type": "application/json"}
                )
                assert bad.status_code == 400
                for expected in (200, 200, 429, 429, 429):
                    response = await http.post(path, json=chat(deltas=3))
                    assert response.status_code == expected, response.text
                assert response.headers["Retry-After"] == "60"
            await eventually(lambda: len(env.gateway.usage) == 6)
            refused = [u for u in env.gateway.usage if u.outcome == "rate_limited"]
            assert [(u.status, u.replica, u.credential_id) for u in refused] == [
                (429, "", credential_id)
            ] * 3
            assert {u.model for u in env.gateway.usage} == {"mdl-x"}
            env_vars = {**os.environ, "FICC_DATA_DIR": str(tmp_path / "data")}
            env_vars.pop("FICC_CONFIG", None)
            ficc = ficc_command(env_vars)
            options = ["--url", env.url, "--token", env.admin_token]
            report = json.loads(await ficc("usage", *options, "--by", "key", "--json"))
            [group] = report["groups"]
            assert group["key"]["name"] == "busy"
            assert group["requests"] == 6
            assert group["errors_by_code"] == {"invalid_json": 1, "rate_limited": 3}
            # 3 completion tokens at 2 units and the prompt's at 1 unit, per served request.
            assert group["spend_milli"] == 2 * (2000 * 3) + 1000 * group["prompt_tokens"]
            table = await ficc("usage", *options, "--by", "key", "--period", "day")
            assert "busy (" in table and "rate_limited 3" in table
