"""The gateway under load (200 concurrent streams) and with a real llama.cpp engine."""

from __future__ import annotations

import httpx
import pytest
import trio

from ..support.gateway_support import chat, gateway_env, sse_events

STREAMS = 200


@pytest.mark.deadline(130)
async def test_200_concurrent_streams_all_complete(tmp_path):
    with trio.fail_after(120):
        async with gateway_env(tmp_path) as env:
            # 2 x 64 slots, the rest queue (the queue holds 4 x 128).
            fences = [await env.launch(), await env.launch()]
            env.publish("svc", fences, concurrency=64)
            _, token = await env.token("svc")
            results: list[tuple[int, int, bool]] = []
            begin = trio.current_time()
            async with env.http(
                token,
                limits=httpx.Limits(max_connections=STREAMS + 10),
                timeout=60,
            ) as http:

                async def one():
                    async with http.stream(
                        "POST",
                        "/api/v1/inference/svc/v1/chat/completions",
                        json=chat(True, deltas=20, interval=0.02),
                    ) as response:
                        body = await response.aread()
                    events = sse_events(body)
                    deltas = [e for e in events if isinstance(e, dict) and e.get("choices")]
                    results.append((response.status_code, len(deltas), events[-1] == "[DONE]"))

                async with trio.open_nursery() as nursery:
                    for _ in range(STREAMS):
                        nursery.start_soon(one)
            took = trio.current_time() - begin
            print(f"{STREAMS} concurrent streams of 20 deltas: {took:.2f} s")
            assert results == [(200, 20, True)] * STREAMS
            usage = list(env.gateway.usage)
            assert len(usage) == STREAMS and all(u.outcome == "ok" for u in usage)
            assert sum(u.completion_tokens for u in usage) == 20 * STREAMS
            assert {u.replica for u in usage} == {f.attempt_id for f in fences}
            assert env.service.live.inflight("svc") == 0
