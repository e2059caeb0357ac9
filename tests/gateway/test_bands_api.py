"""A credential's and a project's priority band, through a real `ficc serve` and its CLI,
and the band header through the real gateway (hypercorn, the embedded agent, the
stand-in engine)."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from ..support.gateway_support import chat, gateway_env
from ..support.serve_support import ServeProcess, first_run_secrets


def _refusal(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


@pytest.mark.deadline(130)
async def test_bands_of_credentials_and_projects_are_stored_shown_and_never_escalated(tmp_path):
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir)
    ficc = server.cli()
    try:
        url = await server.wait_ready()
        admin = {"Authorization": f"Bearer {await server.admin_token()}"}
        with trio.fail_after(120):
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=admin) as http:
                # An administrator sets the project's band; an unknown one is refused.
                response = await http.put("/api/v1/projects/default/band", json={"band": "batch"})
                assert response.status_code == 200, response.text
                assert response.json()["band"] == "batch"
                listed = (await http.get("/api/v1/projects")).json()["projects"]
                assert [p["band"] for p in listed] == ["batch"]
                error = _refusal(
                    await http.put("/api/v1/projects/default/band", json={"band": "gold"}),
                    400,
                    "unknown_band",
                )
                assert error["details"]["bands"] == ["interactive", "standard", "batch"]
                _refusal(
                    await http.put("/api/v1/projects/default/band", json={"band": "Gold Band"}),
                    400,
                    "invalid_request",
                )

                # A browser session's requests are in its project's band.
                password = first_run_secrets(data_dir / "first-run-secrets")["admin password"]
                async with httpx.AsyncClient(base_url=url, timeout=10) as browser:
                    login = {"username": "admin", "password": password, "project": "default"}
                    session = await browser.post("/api/v1/session", json=login)
                    assert session.status_code == 201, session.text
                    principal = session.json()["principal"]
                    assert (principal["band"], principal["project_band"]) == (None, "batch")

                # A credential's band is given when it is minted, and shown.
                minted = await http.post(
                    "/api/v1/tokens",
                    json={
                        "name": "manager",
                        "scopes": ["tokens:manage", "inference:invoke"],
                        "band": "standard",
                    },
                )
                assert minted.status_code == 201, minted.text
                manager = minted.json()
                assert manager["credential"]["band"] == "standard"
                shown = await http.get(f"/api/v1/tokens/{manager['credential']['id']}")
                assert shown.json()["band"] == "standard"
                _refusal(
                    await http.post(
                        "/api/v1/tokens",
                        json={"name": "x", "scopes": ["inference:invoke"], "band": "gold"},
                    ),
                    400,
                    "unknown_band",
                )

            # The manager, in band standard of a batch project, says so, and may give
            # its own band or a lower one, not a higher one.
            mine = {"Authorization": f"Bearer {manager['token']}"}
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=mine) as http:
                whoami = (await http.get("/api/v1/whoami")).json()
                assert (whoami["band"], whoami["project_band"]) == ("standard", "batch")
                error = _refusal(
                    await http.post(
                        "/api/v1/tokens",
                        json={"name": "up", "scopes": ["inference:invoke"], "band": "interactive"},
                    ),
                    403,
                    "band_escalation",
                )
                assert error["details"] == {"band": "interactive", "own_band": "standard"}
                for band in ("standard", "batch", None):
                    body = {"name": f"b-{band}", "scopes": ["inference:invoke"]}
                    if band:
                        body["band"] = band
                    response = await http.post("/api/v1/tokens", json=body)
                    assert response.status_code == 201, response.text
                    assert response.json()["credential"]["band"] == band

            # The CLI writes and reads the same records, from its own process.
            out = await ficc("admin", "set-project-band", "default", "interactive", "--json")
            assert json.loads(out)["band"] == "interactive"
            out = await ficc(
                "admin",
                "create-token",
                "--project",
                "default",
                "--scope",
                "inference:invoke",
                "--band",
                "batch",
                "--json",
            )
            assert json.loads(out)["credential"]["band"] == "batch"
            tokens = json.loads(
                await ficc("admin", "list-tokens", "--project", "default", "--json")
            )
            assert {t["name"]: t["band"] for t in tokens}["manager"] == "standard"
            assert "interactive" in await ficc("admin", "list-projects")
            out = await ficc("admin", "set-project-band", "default", "--clear", "--json")
            assert json.loads(out)["band"] is None
    finally:
        server.proc.terminate()
        server.kill()


@pytest.mark.deadline(70)
async def test_a_requests_band_is_its_credentials_and_the_header_only_lowers_it(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=2)
            _, batch_token = await env.token(band="batch")
            _, standard_token = await env.token()
            path = "/api/v1/inference/svc/v1/chat/completions"

            def admitted(band: str) -> float:
                value = env.service.metrics.registry.get_sample_value(
                    "ficc_gateway_band_queue_wait_seconds_count", {"service": "svc", "band": band}
                )
                return value or 0.0

            async with env.http(batch_token) as http:
                assert (await http.post(path, json=chat())).status_code == 200
                # Asking for a higher band than the credential's is served at its own.
                raised = await http.post(path, json=chat(), headers={"x-ficc-band": "interactive"})
                assert raised.status_code == 200
            assert (admitted("batch"), admitted("standard"), admitted("interactive")) == (2, 0, 0)
            async with env.http(standard_token) as http:
                assert (await http.post(path, json=chat())).status_code == 200
                lowered = await http.post(path, json=chat(), headers={"X-Ficc-Band": "batch"})
                assert lowered.status_code == 200
                unknown = await http.post(path, json=chat(), headers={"x-ficc-band": "gold"})
                error = _refusal(unknown, 400, "unknown_band")
                assert error["details"]["band"] == "gold"
                metrics = (await http.get("/metrics")).text
            assert (admitted("batch"), admitted("standard")) == (3, 1)
            assert 'ficc_gateway_band_queue_wait_seconds_count{band="batch",service="svc"} 3.0' in (
                metrics
            )
            # The refused request held no slot.
            assert env.gateway.load(fence.attempt_id) == 0
