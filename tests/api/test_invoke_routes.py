"""The one invoke handler in front of Quart: every credential by the rules of every route.

Bearer credentials and browser sessions take the same handler (``routes_invoke``);
these checks go through the application as the test client calls it, the same
ASGI entry hypercorn calls. The relaying itself is tested against real engines in
``test_gateway*.py``.
"""

from __future__ import annotations

from ficc_core.routing.live import LiveService

from ..conftest import bearer, issue_token

MODELS = "/api/v1/inference/svc/v1/models"
CHAT = "/api/v1/inference/svc/v1/chat/completions"
BODY = {"model": "alias", "messages": [{"role": "user", "content": "hi"}]}


async def _login(client, password: str) -> str:
    response = await client.post(
        "/api/v1/session", json={"username": "admin", "password": password, "project": "default"}
    )
    assert response.status_code == 201
    return (await response.get_json())["csrf_token"]


async def _code(response) -> tuple[int, str]:
    return response.status_code, (await response.get_json())["error"]["code"]


def _publish(service, project_id: str) -> None:
    service.live.publish(
        LiveService(
            id="svc",
            project_id=project_id,
            alias="alias",
            generation=1,
            admission="serving",
            concurrency=1,
        )
    )


async def test_an_invoke_route_refuses_a_missing_malformed_or_node_credential(client, bootstrap):
    response = await client.post(CHAT, json=BODY)
    assert await _code(response) == (401, "unauthenticated")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="ficc"'
    for header in ("Basic YWRtaW46eA==", "Bearer ", "Bearer"):
        response = await client.post(CHAT, json=BODY, headers={"Authorization": header})
        assert await _code(response) == (401, "invalid_credential"), header
    response = await client.post(CHAT, json=BODY, headers=bearer("ficcnode_abc_def"))
    assert await _code(response) == (403, "node_credential_refused")
    response = await client.post(CHAT, json=BODY, headers=bearer("ficc_not_a_real_one"))
    assert (await _code(response))[0] == 401


async def test_a_session_cookie_invokes_with_the_csrf_token_and_reads_without(
    client, service, bootstrap
):
    project = await service.auth.get_project("default")
    _publish(service, project.id)
    csrf = await _login(client, bootstrap["password"])
    # A write without the CSRF token, or with a wrong one, is refused before the gateway.
    assert await _code(await client.post(CHAT, json=BODY)) == (403, "csrf_failed")
    wrong = await client.post(CHAT, json=BODY, headers={"X-CSRF-Token": "nope"})
    assert await _code(wrong) == (403, "csrf_failed")
    # With it, the gateway takes over (this service has no ready replica).
    served = await client.post(CHAT, json=BODY, headers={"X-CSRF-Token": csrf})
    assert await _code(served) == (503, "no_ready_replica")
    # A read needs no CSRF token.
    models = await client.get(MODELS)
    assert models.status_code == 200
    assert [m["id"] for m in (await models.get_json())["data"]] == ["alias"]
    # An Authorization header wins over the cookie, as on every route.
    response = await client.get(MODELS, headers={"Authorization": "Basic eA=="})
    assert await _code(response) == (401, "invalid_credential")


async def test_head_is_get_without_a_body_and_another_method_is_quarts_405(
    client, service, bootstrap
):
    project = await service.auth.get_project("default")
    _publish(service, project.id)
    token = await issue_token(service, scopes={"inference:invoke"})
    got = await client.get(MODELS, headers=bearer(token))
    head = await client.head(MODELS, headers=bearer(token))
    assert (got.status_code, head.status_code) == (200, 200)
    assert await head.get_data() == b""
    wrong = await client.get(CHAT, headers=bearer(token))
    assert await _code(wrong) == (405, "method_not_allowed")
    assert wrong.headers["Allow"] == "POST"


async def test_the_invoke_routes_are_counted_under_their_route_template(client, service, bootstrap):
    token = await issue_token(service, scopes={"inference:invoke"})
    await client.post(CHAT, json=BODY, headers=bearer(token))
    route = "/api/v1/inference/<service_id>/v1/chat/completions"
    labels = {"route": route, "method": "POST", "status": "404"}
    assert service.metrics.registry.get_sample_value("ficc_http_requests_total", labels) == 1
