"""The limit routes and `ficc admin set-limits`/`show-limits` against a real `ficc serve`:
validation field by field, scopes (admin; tokens:manage for its own project's keys only),
and a limit set from another process applying in the server within the sync interval."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from ..support.serve_support import FICC, ServeProcess


def _errors(response: httpx.Response) -> list[dict]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    return error["details"]["errors"]


@pytest.mark.deadline(130)
async def test_limits_routes_and_cli_set_show_and_reach_the_server_from_another_process(
    tmp_path,
):
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir)
    ficc = server.cli()
    try:
        url = await server.wait_ready()
        admin = {"Authorization": f"Bearer {await server.admin_token()}"}
        with trio.fail_after(120):
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=admin) as http:
                view = (await http.get("/api/v1/projects/default/limits")).json()
                assert view["scope"] == "project" and view["name"] == "default"
                assert view["limits"] == {"rpm": None, "tpm": None, "budget": None, "period": None}
                assert view["use"]["requests"] == 0

                put = await http.put(
                    "/api/v1/projects/default/limits",
                    json={"rpm": 100, "budget": 5, "period": "month"},
                )
                assert put.status_code == 200, put.text
                assert put.json()["limits"] == {
                    "rpm": 100,
                    "tpm": None,
                    "budget": 5,
                    "period": "month",
                }
                bad = await http.put(
                    "/api/v1/projects/default/limits",
                    json={"rpm": -1, "tpm": 1.5, "period": "week", "burst": 3},
                )
                assert _errors(bad) == [
                    {"path": "$.burst", "message": "unknown field"},
                    {"path": "$.rpm", "message": "expected a non-negative integer or null"},
                    {"path": "$.tpm", "message": "expected a non-negative integer or null"},
                    {"path": "$.period", "message": "expected day, month or null"},
                ]
                # Nothing changed; null clears one field and keeps the others.
                cleared = await http.put("/api/v1/projects/default/limits", json={"rpm": None})
                assert cleared.json()["limits"] == {
                    "rpm": None,
                    "tpm": None,
                    "budget": 5,
                    "period": "month",
                }
                missing = await http.get("/api/v1/projects/nope/limits")
                assert missing.status_code == 404

                users = (await http.get("/api/v1/users")).json()["users"]
                user_id = users[0]["id"]
                put = await http.put(f"/api/v1/users/{user_id}/limits", json={"tpm": 5000})
                assert put.status_code == 200, put.text
                assert (put.json()["scope"], put.json()["name"]) == ("user", "admin")
                by_name = await http.get("/api/v1/users/admin/limits")
                assert by_name.json()["limits"]["tpm"] == 5000
                nobody = await http.get("/api/v1/users/nobody/limits")
                assert (nobody.status_code, nobody.json()["error"]["code"]) == (
                    404,
                    "user_not_found",
                )

                me = (await http.get("/api/v1/whoami")).json()["id"]
                put = await http.put(f"/api/v1/tokens/{me}/limits", json={"budget": 2})
                assert _errors(put) == [
                    {"path": "$.period", "message": "a budget needs a period: day or month"}
                ]

            # A token manager of another project sees no key of this one.
            other = json.loads(await ficc("admin", "create-project", "other", "--json"))
            minted = json.loads(
                await ficc(
                    "admin",
                    "create-token",
                    "--project",
                    "other",
                    "--scope",
                    "tokens:manage",
                    "--json",
                )
            )
            manager = {"Authorization": f"Bearer {minted['token']}"}
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=manager) as http:
                refused = await http.get(f"/api/v1/tokens/{me}/limits")
                assert refused.status_code == 404, refused.text
                refused = await http.put(f"/api/v1/tokens/{me}/limits", json={"rpm": 1})
                assert refused.status_code == 404, refused.text
                own = minted["credential"]["id"]
                put = await http.put(f"/api/v1/tokens/{own}/limits", json={"rpm": 9})
                assert put.status_code == 200, put.text
                forbidden = await http.get("/api/v1/projects/other/limits")
                assert forbidden.status_code == 403

            # The CLI writes from its own process; the server reloads within the interval.
            out = await ficc("admin", "set-limits", "--project", "default", "--rpm", "7", "--json")
            assert json.loads(out)["limits"]["rpm"] == 7
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=admin) as http:
                while True:
                    view = (await http.get("/api/v1/projects/default/limits")).json()
                    if view["limits"]["rpm"] == 7:
                        break
                    await trio.sleep(0.05)
            assert view["limits"]["budget"] == 5
            shown = json.loads(
                await ficc("admin", "show-limits", "--token", minted["credential"]["id"], "--json")
            )
            assert (shown["scope"], shown["limits"]["rpm"]) == ("credential", 9)
            human = await ficc("admin", "show-limits", "--project", other["id"])
            assert "rpm:" in human and "default" in human
            out = await ficc("admin", "set-limits", "--project", "default", "--clear", "--json")
            assert json.loads(out)["limits"]["budget"] is None
            refused = await trio.run_process(
                [*FICC, "admin", "set-limits", "--user", "admin", "--budget", "3"],
                env=server.env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert refused.returncode != 0
            assert "--period: a budget needs a period" in refused.stderr.decode()
    finally:
        server.proc.terminate()
        server.kill()
