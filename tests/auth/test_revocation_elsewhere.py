"""A revocation written by another process: one statement in the docs, and what happens.

docs/api.md and docs/gateway.md carry the sentence ``revocation_statement()`` renders
from the period in ``ficc_core.auth``; a real `ficc admin revoke-token` process then
shows it holds: within that period new requests are refused and open streams end.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import trio

from ficc_core.auth.authority import CREDENTIAL_CACHE_SECONDS, revocation_statement

from ..support.gateway_support import chat, gateway_env
from ..support.serve_support import FICC

DOCS = Path(__file__).resolve().parents[2] / "docs"
PATH = "/api/v1/inference/svc/v1/chat/completions"


def _prose(name: str) -> str:
    return re.sub(r"\s+", " ", (DOCS / name).read_text(encoding="utf-8"))


def test_api_and_gateway_docs_make_one_statement_about_revocation_by_another_process():
    statement = revocation_statement()
    assert f"within {CREDENTIAL_CACHE_SECONDS:g} s" in statement
    for name in ("api.md", "gateway.md"):
        assert statement in _prose(name), name


@pytest.mark.deadline(100)
async def test_a_revocation_by_another_process_refuses_requests_and_ends_streams_in_time(
    tmp_path,
):
    with trio.fail_after(90):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            credential_id, token = await env.token("svc")
            revoked_at: list[float] = []

            async def revoke_elsewhere() -> None:
                environment = {**os.environ, "FICC_DATA_DIR": str(env.service.config.data_dir)}
                environment.pop("FICC_CONFIG", None)
                done = await trio.run_process(
                    [*FICC, "admin", "revoke-token", credential_id, "--json"],
                    env=environment,
                    capture_stdout=True,
                    capture_stderr=True,
                )
                assert json.loads(done.stdout)["revoked_at"] is not None
                revoked_at.append(trio.current_time())

            events = []
            async with env.http(token) as http:
                async with http.stream(
                    "POST", PATH, json=chat(True, deltas=100_000, interval=0.01)
                ) as response:
                    assert response.status_code == 200
                    async with trio.open_nursery() as nursery:
                        async for line in response.aiter_lines():
                            if line.startswith("data: "):
                                events.append(line.removeprefix("data: "))
                            if len(events) == 3:
                                nursery.start_soon(revoke_elsewhere)
            ended = trio.current_time()
            assert revoked_at, "the stream ended before the revocation was written"
            assert ended - revoked_at[0] < CREDENTIAL_CACHE_SECONDS + 1
            assert json.loads(events[-1])["error"]["code"] == "credential_revoked"
            async with env.http(token) as http:
                response = await http.post(PATH, json=chat())
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "credential_revoked"
