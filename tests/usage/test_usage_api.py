"""GET /api/v1/usage over the real app and SQLite store: filters, groups, scope, names.

The records go through the controller's own ledger (as the gateway hands them over);
the services and models they name are rows of the real tables.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
from click.testing import CliRunner

from ficc_core.base.errors import NotFound
from ficc_core.cli.main import cli
from ficc_core.usage import UsageQuery, UsageRecord, usage_report

from ..conftest import bearer

#: When the usage was recorded: set by ``used`` as each test starts, so that ``period=day``
#: means the day the test runs in (an import-time value went stale when a run crossed
#: midnight, and the day's groups came back empty).
NOW = time.time()


def record(credential, *, service_id="svc-1", model="mdl-1", **fields) -> UsageRecord:
    values = dict(
        service_id=service_id,
        generation=1,
        replica="r1",
        node_id="local",
        credential_id=credential.id,
        credential_kind="credential",
        path="/v1/chat/completions",
        status=200,
        outcome="ok",
        prompt_tokens=100,
        completion_tokens=50,
        queue_wait=0.0,
        ttfb=0.05,
        duration=0.2,
        finished_at=NOW,
        project_id=credential.project_id,
        user_id=credential.user_id,
        model=model,
        cost=1500,
    )
    values.update(fields)
    return UsageRecord(**values)


def refusal(credential, code: str, status: int = 429, **fields) -> UsageRecord:
    fields = {"replica": "", "node_id": "", "prompt_tokens": None, "completion_tokens": None}
    return record(
        credential, status=status, outcome=code, ttfb=None, duration=0.0, cost=0, **fields
    )


@pytest.fixture
async def used(service, bootstrap):
    """Two projects' keys, two people, two services and models, and their usage."""
    global NOW
    NOW = time.time()
    auth = service.auth
    team = await auth.create_project("team")
    default = await auth.get_project("default")
    alice = await auth.create_user("alice", "alice-password-1", projects={default.id: set()})
    bob = await auth.create_user("bob", "bob-password-1", projects={team.id: set()})
    scopes = frozenset({"inference:invoke"})
    ka, _ = await auth.create_credential(
        default.id, name="alice-key", scopes=scopes, user_id=alice.id
    )
    kb, _ = await auth.create_credential(team.id, name="bob-key", scopes=scopes, user_id=bob.id)
    kr, reader = await auth.create_credential(
        default.id, name="reader", scopes=frozenset({"inference:read"})
    )

    def rows(tx) -> None:
        for model_id, project_id, name in (
            ("mdl-1", default.id, "smol"),
            ("mdl-2", team.id, "big"),
        ):
            tx.execute(
                "INSERT INTO models (id, project_id, name, manifest, digest, created_at)"
                " VALUES (?, ?, ?, '{}', 'x', ?)",
                (model_id, project_id, name, NOW),
            )
        for service_id, project_id, alias, model_id in (
            ("svc-1", default.id, "chat", "mdl-1"),
            ("svc-2", team.id, "bulk", "mdl-2"),
        ):
            tx.execute(
                "INSERT INTO inference_services (id, project_id, alias, model_id, spec, revision,"
                " generation, desired, state, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, '{}', 1, 1, 'running', 'ready', ?, ?)",
                (service_id, project_id, alias, model_id, NOW, NOW),
            )

    await service.store.write(rows)
    ledger = service.usage
    for duration in (0.1, 0.2, 0.3, 0.4):
        ledger.record(record(ka, duration=duration))
    ledger.record(refusal(ka, "rate_limited"))
    ledger.record(refusal(ka, "rate_limited"))
    ledger.record(refusal(ka, "service_saturated"))
    ledger.record(record(kb, service_id="svc-2", model="mdl-2", cost=250, prompt_tokens=7))
    ledger.record(record(kb, service_id="svc-2", model="mdl-2", finished_at=NOW - 3 * 86400))
    return {"ka": ka, "kb": kb, "kr": kr, "reader": reader, "team": team, "default": default}


async def get(client, token, **params) -> dict:
    response = await client.get("/api/v1/usage", headers=bearer(token), query_string=params)
    assert response.status_code == 200, await response.get_data()
    return await response.get_json()


async def test_totals_count_429s_in_errors_by_code_and_spend_exactly(client, bootstrap, used):
    report = await get(client, bootstrap["token"], period="1d")
    totals = report["totals"]
    assert totals["requests"] == 8
    assert totals["errors"] == 3
    assert totals["errors_by_code"] == {"rate_limited": 2, "service_saturated": 1}
    assert totals["prompt_tokens"] == 4 * 100 + 7
    assert totals["completion_tokens"] == 5 * 50
    assert (totals["spend_milli"], totals["spend"]) == (4 * 1500 + 250, 6.25)
    # Refusals have no latency: the percentiles are of the five answered requests.
    assert totals["latency"]["duration"] == {"p50": 0.2, "p90": 0.4, "p99": 0.4}
    assert totals["latency"]["ttfb"]["p50"] == 0.05
    everything = await get(client, bootstrap["token"])
    assert everything["totals"]["requests"] == 9


async def test_groups_carry_names_beside_ids(client, bootstrap, used):
    token, ka, kb = bootstrap["token"], used["ka"], used["kb"]
    by_key = await get(client, token, group_by="key", period="day")
    assert {(g["key"]["id"], g["key"]["name"], g["requests"]) for g in by_key["groups"]} == {
        (ka.id, "alice-key", 7),
        (kb.id, "bob-key", 1),
    }
    by_many = await get(client, token, group_by="person,project,model,service", period="day")
    named = {
        (g["person"]["name"], g["project"]["name"], g["model"]["name"], g["service"]["name"])
        for g in by_many["groups"]
    }
    assert named == {("alice", "default", "smol", "chat"), ("bob", "team", "big", "bulk")}
    alice = next(g for g in by_many["groups"] if g["person"]["name"] == "alice")
    assert alice["person"]["id"] == ka.user_id and alice["service"]["id"] == "svc-1"
    assert alice["errors_by_code"] == {"rate_limited": 2, "service_saturated": 1}
    assert alice["latency"]["duration"]["p50"] == 0.2


@pytest.mark.parametrize(
    ("params", "requests"),
    [
        ({"person": "alice"}, 7),
        ({"project": "team"}, 2),
        ({"model": "big"}, 2),
        ({"model": "mdl-1"}, 7),
        ({"service": "chat"}, 7),
        ({"service": "svc-2", "period": "day"}, 1),
        ({"since": 1}, 0),  # seconds from NOW
        ({"until": -86400}, 1),
    ],
)
async def test_filters(client, bootstrap, used, params, requests):
    params = {k: str(NOW + v) if k in ("since", "until") else v for k, v in params.items()}
    assert (await get(client, bootstrap["token"], **params))["totals"]["requests"] == requests


async def test_filter_by_key(client, bootstrap, used):
    report = await get(client, bootstrap["token"], key=used["kb"].id)
    assert report["totals"]["requests"] == 2 and report["filters"] == {"key": used["kb"].id}


async def test_a_project_principal_sees_only_its_project(client, used):
    reader = used["reader"]
    report = await get(client, reader, group_by="project")
    assert [g["project"]["name"] for g in report["groups"]] == ["default"]
    assert report["totals"]["requests"] == 7
    # Another project's usage stays hidden: asked for by name, it reads as missing.
    assert (await _refused(client, reader, project="team"))["code"] == "project_not_found"


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"group_by": "colour"}, "group_by"),
        ({"period": "weekly"}, "period"),
        ({"period": "day", "since": "5"}, "period"),
        ({"since": "-1"}, "since"),
        ({"person": "x" * 201}, "person"),
    ],
)
async def test_bad_queries_are_400(client, bootstrap, used, params, name):
    response = await client.get(
        "/api/v1/usage", headers=bearer(bootstrap["token"]), query_string=params
    )
    assert response.status_code == 400
    body = await response.get_json()
    assert body["error"]["code"] == "invalid_request"
    assert body["error"]["details"]["errors"][0]["path"] == name


async def test_the_service_summary_names_its_credentials_and_people(service, used):
    summary = await service.usage.summary("svc-1")
    assert summary.alias == "chat"
    assert (summary.totals.requests, summary.totals.errors, summary.totals.cost) == (7, 3, 6000)
    # The means are of the requests that reached a replica, not of the refusals.
    assert summary.totals.mean_duration == pytest.approx(0.25)
    [row] = summary.by_credential
    assert (row.credential_id, row.name, row.username) == (used["ka"].id, "alice-key", "alice")
    assert (row.requests, row.errors, row.cost) == (7, 3, 6000)


async def test_a_personal_principal_sees_only_its_personal_usage(service, used):
    ka = used["ka"]
    service.usage.record(record(ka, project_id="", cost=40))  # a personal key's request
    await service.usage.flush()

    def report(query: UsageQuery):
        return service.store.read(partial(usage_report, query=query))

    mine = await report(UsageQuery(scope_person=ka.user_id))
    assert (mine.totals.requests, mine.totals.cost) == (1, 40)
    assert (await report(UsageQuery(scope_person=used["kb"].user_id))).totals.requests == 0
    # The project sees its keys' requests and those to its services: the personal one too.
    assert (await report(UsageQuery(scope_project=ka.project_id))).totals.requests == 8


async def _refused(client, token, **params) -> dict:
    response = await client.get("/api/v1/usage", headers=bearer(token), query_string=params)
    assert response.status_code == 404, await response.get_data()
    return (await response.get_json())["error"]


async def test_a_service_filter_naming_no_service_is_404(client, bootstrap, used):
    error = await _refused(client, bootstrap["token"], service="no-such-service")
    assert error["code"] == "service_not_found"
    assert error["details"] == {"id": "no-such-service", "filter": "service"}
    assert "'no-such-service'" in error["message"]
    # Another project's service is unknown to a project principal, as a missing one is.
    assert (await _refused(client, used["reader"], service="bulk"))["code"] == "service_not_found"
    assert (await _refused(client, used["reader"], service="svc-2"))["details"]["id"] == "svc-2"
    # Valid input is answered as before: by ID or alias, for the administrator too.
    assert (await get(client, used["reader"], service="chat"))["totals"]["requests"] == 7
    assert (await get(client, bootstrap["token"], service="bulk"))["totals"]["requests"] == 2


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("key", "credential_not_found"),
        ("person", "user_not_found"),
        ("project", "project_not_found"),
        ("model", "model_not_found"),
    ],
)
async def test_every_filter_naming_nothing_is_404_with_its_code(
    client, bootstrap, used, name, code
):
    # Only the service filter was checked: a mistyped model or person read as no usage.
    error = await _refused(client, bootstrap["token"], **{name: "no-such-thing"})
    assert (error["code"], error["details"]) == (code, {"id": "no-such-thing", "filter": name})
    assert "'no-such-thing'" in error["message"] and f"the {name} filter takes" in error["message"]


async def test_a_project_reader_knows_its_own_and_what_its_usage_names_only(service, client, used):
    reader, ka, kb = used["reader"], used["ka"], used["kb"]
    theirs = {"key": kb.id, "person": "bob", "model": "big", "project": used["team"].id}
    for name, value in theirs.items():
        error = await _refused(client, reader, **{name: value})
        assert error["details"] == {"id": value, "filter": name}
    ours = {"key": ka.id, "person": "alice", "model": "smol", "project": "default"}
    for name, value in ours.items():
        assert (await get(client, reader, **{name: value}))["totals"]["requests"] == 7, name
    # Its own key with no usage is known (zero), not missing.
    assert (await get(client, reader, key=used["kr"].id))["totals"]["requests"] == 0
    # Bob is no member, but his request to the project's service is its usage: known.
    service.usage.record(record(kb, service_id="svc-1", model="mdl-1"))
    await service.usage.flush()
    assert (await get(client, reader, person="bob"))["totals"]["requests"] == 1
    assert (await get(client, reader, key=kb.id))["totals"]["requests"] == 1


async def test_a_personal_reader_knows_its_keys_and_projects_only(service, used):
    ka, kb = used["ka"], used["kb"]

    def report(**filters):
        query = UsageQuery(scope_person=ka.user_id, **filters)
        return service.store.read(partial(usage_report, query=query))

    assert (await report(key=ka.id, person="alice", project="default")).totals.requests == 0
    for name, value in {"key": kb.id, "person": "bob", "project": "team", "model": "big"}.items():
        with pytest.raises(NotFound) as refused:
            await report(**{name: value})
        assert refused.value.details == {"id": value, "filter": name}


async def test_a_removed_services_usage_is_still_found_by_its_id(service, client, bootstrap, used):
    service.usage.record(record(used["ka"], service_id="svc-gone"))
    await service.usage.flush()
    report = await get(client, used["reader"], service="svc-gone")
    assert report["totals"]["requests"] == 1 and report["filters"] == {"service": "svc-gone"}


async def test_a_personal_reader_knows_the_services_shared_with_it(service, used):
    ka = used["ka"]

    def report(name: str):
        query = UsageQuery(scope_person=ka.user_id, service=name)
        return service.store.read(partial(usage_report, query=query))

    with pytest.raises(NotFound) as refused:
        await report("bulk")
    assert refused.value.code == "service_not_found"

    def share(tx) -> None:
        tx.execute(
            "INSERT INTO service_shares (service_id, user_id, created_at) VALUES (?, ?, ?)",
            ("svc-2", ka.user_id, NOW),
        )

    await service.store.write(share)
    assert (await report("bulk")).totals.requests == 0


def test_ficc_usage_names_an_unknown_service_and_exits_non_zero(live_server):
    argv = ["usage", "--url", live_server.url, "--token", live_server.bootstrap["token"]]
    runner = CliRunner()
    env = {"FICC_URL": None, "FICC_TOKEN": None}
    result = runner.invoke(cli, [*argv, "--service", "no-such-service"], env=env)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "no inference service 'no-such-service'" in line and "[service_not_found]" in line
    assert runner.invoke(cli, [*argv, "--json"], env=env).exit_code == 0


async def test_the_service_usage_route_says_spend_as_the_usage_report_does(client, used):
    response = await client.get("/api/v1/inference/svc-1/usage", headers=bearer(used["reader"]))
    assert response.status_code == 200, await response.get_data()
    view = await response.get_json()
    # spend (units) and spend_milli (exact) as GET /api/v1/usage says them; cost (the
    # same milli-units, deprecated) stays for the clients that read it.
    totals = view["totals"]
    assert (totals["cost"], totals["spend_milli"], totals["spend"]) == (6000, 6000, 6.0)
    [row] = view["by_credential"]
    assert (row["cost"], row["spend_milli"], row["spend"]) == (6000, 6000, 6.0)
    assert len(view["recent"]) == 7
    for entry in view["recent"]:
        assert entry["spend_milli"] == entry["cost"]
        assert entry["spend"] == entry["cost"] / 1000
    report = await get(client, used["reader"], service="svc-1")
    assert report["totals"]["spend_milli"] == totals["spend_milli"]
    assert report["totals"]["spend"] == totals["spend"]
