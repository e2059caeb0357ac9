"""Personal keys through the real gateway: a real controller, embedded agent, stand-in
engine and hypercorn (tests/support/gateway_support.py); services shared with a person, or with
everyone, are what its personal keys reach, by the per-service routes and the project
endpoint."""

from __future__ import annotations

import httpx
import pytest
import trio

from ..support.gateway_support import chat as standin_chat
from ..support.gateway_support import gateway_env
from .test_people import PASSWORD, insert_service


def chat(model: str = "alpha") -> dict:
    return standin_chat(model=model)


async def _error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


async def _personal_key(env, username: str) -> str:
    """``username`` logs in personally in a browser and mints a personal key."""
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as browser:
        login = await browser.post(
            "/api/v1/session", json={"username": username, "password": PASSWORD}
        )
        assert login.status_code == 201, login.text
        minted = await browser.post(
            "/api/v1/me/tokens",
            json={"name": "laptop"},
            headers={"X-CSRF-Token": login.json()["csrf_token"]},
        )
        assert minted.status_code == 201, minted.text
        return minted.json()["token"]


@pytest.mark.deadline(100)
async def test_a_personal_key_invokes_exactly_the_services_shared_with_its_person(tmp_path):
    with trio.fail_after(90):
        async with gateway_env(tmp_path) as env:
            auth = env.service.auth
            other = await auth.create_project("other")
            _, other_manager = await env.token(project="other", scopes={"inference:manage"})
            # Two projects' services share the alias `alpha`; `gamma` is shared with no one.
            await insert_service(env.service, "svc-a", env.project_id, "alpha")
            await insert_service(env.service, "svc-b", other.id, "alpha")
            await insert_service(env.service, "svc-c", other.id, "gamma")
            fence = await env.launch()
            env.publish("svc-a", [fence], alias="alpha", created=100)
            env.publish("svc-c", [fence], alias="gamma", created=300, project_id=other.id)
            env.publish("svc-b", [fence], alias="alpha", created=200, project_id=other.id)
            await auth.create_user("nina", PASSWORD)
            await auth.create_user("omar", PASSWORD)
            key = await _personal_key(env, "nina")
            omar_key = await _personal_key(env, "omar")

            async with env.http(env.admin_token) as admin, env.http(other_manager) as theirs:
                shared = await admin.put("/api/v1/inference/svc-a/shares", json={"users": ["nina"]})
                assert shared.status_code == 200, shared.text
                everyone = await theirs.put(
                    "/api/v1/inference/svc-b/shares", json={"everyone": True}
                )
                assert everyone.json()["everyone"] is True
                # Project scoping holds for shares too: not another project's service.
                await _error(
                    await admin.put("/api/v1/inference/svc-c/shares", json={"everyone": True}),
                    404,
                    "service_not_found",
                )

            async with env.http(key) as nina, env.http(omar_key) as omar:
                # /v1/models lists exactly what is shared; the later `alpha` by its ID.
                models = (await nina.get("/v1/models")).json()["data"]
                assert [(m["id"], m["owned_by"]) for m in models] == [
                    ("alpha", env.project_id),
                    ("svc-b", other.id),
                ]
                omars = (await omar.get("/v1/models")).json()["data"]
                assert [m["id"] for m in omars] == ["alpha"]  # everyone's: svc-b
                # One model's entry is the one /v1/models lists, by the id it lists it by.
                for entry in models:
                    assert (await nina.get(f"/v1/models/{entry['id']}")).json() == entry

                # The earliest-created answers the alias; the ID reaches the other one.
                served = await nina.post("/v1/chat/completions", json=chat())
                assert served.status_code == 200, served.text
                assert served.headers["x-ficc-service"] == "alpha"
                assert (await omar.post("/v1/chat/completions", json=chat())).status_code == 200
                by_id = await nina.post("/v1/chat/completions", json=chat(model="svc-b"))
                assert by_id.status_code == 200, by_id.text
                await _error(
                    await nina.post("/v1/chat/completions", json=chat(model="gamma")),
                    404,
                    "model_not_found",
                )

                # The per-service routes: shared ones answer, an unshared one is not found.
                listed = (await nina.get("/api/v1/inference/svc-b/v1/models")).json()["data"]
                assert [(m["id"], m["owned_by"]) for m in listed] == [("alpha", other.id)]
                for service_id in ("svc-a", "svc-b"):
                    path = f"/api/v1/inference/{service_id}/v1/chat/completions"
                    assert (await nina.post(path, json=chat())).status_code == 200
                await _error(
                    await nina.post("/api/v1/inference/svc-c/v1/chat/completions", json=chat()),
                    404,
                    "service_not_found",
                )
                await _error(
                    await omar.post("/api/v1/inference/svc-a/v1/chat/completions", json=chat()),
                    404,
                    "service_not_found",
                )
                # No management route, not even the shared service's own.
                for path in ("/api/v1/inference/svc-a", "/api/v1/inference/svc-a/shares"):
                    await _error(await nina.get(path), 403, "missing_scope")

                # Unsharing applies to the next request in this process.
                async with env.http(env.admin_token) as admin:
                    await admin.put("/api/v1/inference/svc-a/shares", json={"users": []})
                await _error(
                    await nina.post("/api/v1/inference/svc-a/v1/chat/completions", json=chat()),
                    404,
                    "service_not_found",
                )
                models = (await nina.get("/v1/models")).json()["data"]
                assert [m["id"] for m in models] == ["alpha"]  # now svc-b's alias is free
                assert models[0]["owned_by"] == other.id

            # Each person reads their own personal usage (and only theirs).
            async with env.http(key) as nina, env.http(omar_key) as omar:
                mine = (await nina.get("/api/v1/me/usage", params={"group_by": "service"})).json()
                totals = mine["totals"]
                assert totals["requests"] - totals["errors"] == 4, totals
                # Her refusals with her key known: gamma by name, svc-c and the unshared svc-a.
                assert totals["errors_by_code"] == {"model_not_found": 1, "service_not_found": 2}
                served_by = {
                    g["service"]["id"]: g["requests"] - g["errors"] for g in mine["groups"]
                }
                assert served_by["svc-a"] == 2 and served_by["svc-b"] == 2, mine["groups"]
                theirs = (await omar.get("/api/v1/me/usage")).json()["totals"]
                assert theirs["requests"] - theirs["errors"] == 1, theirs
            _, no_person = await env.token()
            async with env.http(no_person) as anonymous:
                await _error(await anonymous.get("/api/v1/me/usage"), 403, "no_person")
