"""Specification validation, placement reasons, transactional submit races, scopes, tokens.

Nodes here are registered and report a snapshot through the real registry (a GPU
node cannot exist on this machine, so its snapshot is the edge we fake); nothing
is launched on them.
"""

from __future__ import annotations

import hashlib

import pytest
import trio

from ficc_core.auth import ALL_SCOPES
from ficc_core.schema import (
    ExecutorSnapshot,
    GpuDevice,
    InstalledRuntime,
    NodeResources,
    ProviderInfo,
)

from ..conftest import issue_token
from ..support.inference_support import open_inference_controller
from ..support.models_support import random_bytes

GIB = 1024**3
PACKAGE = "sha256:" + "a" * 64
IMAGE = "sha256:" + "b" * 64


async def _gpu_node(
    controller,
    node_id: str,
    *,
    gpus: tuple[int, ...] = (80 * GIB, 80 * GIB),
    cpus: float = 16,
    memory_bytes: int = 256 * GIB,
    disk_free_bytes: int = 1000 * GIB,
    endpoint_version: int | None = 1,
    image_digest: str = IMAGE,
) -> None:
    registry = controller.service.contributors
    await registry.add_node(node_id)
    connection = await registry.connect(node_id)
    snapshot = ExecutorSnapshot(
        node_id=node_id,
        providers=[ProviderInfo(name="process", package_digest=PACKAGE)],
        resources=NodeResources(
            cpus=cpus,
            memory_bytes=memory_bytes,
            disk_free_bytes=disk_free_bytes,
            gpus=[
                GpuDevice(index=index, name="NVIDIA H100", memory_bytes=size)
                for index, size in enumerate(gpus)
            ],
        ),
        runtimes=[
            InstalledRuntime(
                name="llama_server",
                executor_provider="process",
                package_digest=PACKAGE,
                image_digest=image_digest,
            )
        ],
        endpoint_version=endpoint_version,
    )
    await registry.heartbeat(node_id, connection, snapshot)


async def _tiny_model(controller, name: str = "tiny", *, upload: bool = True) -> str:
    content = random_bytes(4096, seed=len(name))
    manifest = {
        "name": name,
        "format": "gguf",
        "files": [
            {
                "path": "tiny.gguf",
                "size": len(content),
                "sha256": hashlib.sha256(content).hexdigest(),
            }
        ],
    }
    model = await controller.ok("POST", "/api/v1/models", status=201, json=manifest)
    if upload:
        response = await controller.call(
            "POST",
            f"/api/v1/models/{model['id']}/files/0/bytes",
            params={"offset": 0},
            content=content,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert response.status_code in (200, 201), response.text
        model_url = f"/api/v1/models/{model['id']}"
        while (await controller.ok("GET", model_url))["state"] != "verified":  # noqa: ASYNC110
            await trio.sleep(0.02)
    return model["id"]


def _spec(model_id: str, *placements: dict, alias: str = "svc", **options) -> dict:
    return {
        "alias": alias,
        "model_id": model_id,
        "engine": "llama_cpp",
        "runtime": {
            "executor_provider": "process",
            "package_digest": PACKAGE,
            "image_digest": IMAGE,
            "isolation": "process",
        },
        "image_executable": "/opt/llama/llama-server",
        "context": 4096,
        "concurrency": 4,
        "placements": list(placements),
        **options,
    }


def _placement(node_id: str, *, cpus=2, memory=8 * GIB, gpus=()) -> dict:
    return {
        "node_id": node_id,
        "limits": {
            "cpus": cpus,
            "memory_bytes": memory,
            "gpus": [{"index": index, "memory_bytes": size} for index, size in gpus],
        },
    }


@pytest.fixture
async def controller(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path, embedded=False) as controller:
            yield controller


async def test_preview_lists_planned_reservations_per_node_and_device_and_writes_nothing(
    controller,
):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    spec = _spec(
        model_id,
        _placement("gpu-1", gpus=[(0, 24 * GIB), (1, 24 * GIB)]),
        _placement("gpu-1", cpus=4, memory=16 * GIB, gpus=[(1, 40 * GIB)]),
        tensor_split=[1, 1],
    )
    spec["placements"][1]["limits"]["gpus"].append({"index": 0, "memory_bytes": GIB})
    preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
    assert preview["fits"] is True
    assert [r["fits"] for r in preview["replicas"]] == [True, True]
    [node] = preview["nodes"]
    assert node["node_id"] == "gpu-1"
    assert node["cpus"] == {"capacity": 16.0, "reserved": 0.0, "planned": 6.0}
    assert node["memory_bytes"]["planned"] == 24 * GIB
    # The model is staged once on a node, whatever its replicas.
    assert node["disk_bytes"]["planned"] == 4096
    assert [(g["index"], g["planned"]) for g in node["gpus"]] == [
        (0, 25 * GIB),
        (1, 64 * GIB),
    ]
    assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []
    again = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
    assert again["plan_digest"] == preview["plan_digest"]


async def test_preview_gives_each_reason_as_a_code_and_an_actionable_sentence(controller):
    await _gpu_node(controller, "gpu-1", gpus=(80 * GIB, 10 * GIB))
    await _gpu_node(controller, "old-1", endpoint_version=None)
    await _gpu_node(controller, "other-1", image_digest="sha256:" + "c" * 64)
    await controller.service.contributors.add_node("never-1")
    model_id = await _tiny_model(controller)
    spec = _spec(
        model_id,
        _placement("gpu-1", cpus=64, memory=512 * GIB, gpus=[(1, 24 * GIB), (5, GIB)]),
        _placement("old-1"),
        _placement("other-1"),
        _placement("never-1"),
        _placement("nowhere-1"),
    )
    preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
    assert preview["fits"] is False
    reasons = {r["index"]: r["reasons"] for r in preview["replicas"]}
    by_code = {reason["code"]: reason["message"] for reason in reasons[0]}
    assert by_code["insufficient_gpu_memory"] == (
        "node gpu-1 has 10 GiB free on GPU 1; the replica asks 24 GiB"
    )
    assert by_code["insufficient_cpu"] == (
        "node gpu-1 has 16 CPUs free of 16 CPUs; the replica asks 64 CPUs"
    )
    assert "has 256 GiB of memory free; the replica asks 512 GiB" in by_code["insufficient_memory"]
    assert by_code["gpu_not_found"] == "node gpu-1 has no GPU 5 (its GPUs: 0, 1)"
    assert [r["code"] for r in reasons[1]] == ["endpoint_version_unsupported"]
    assert [r["code"] for r in reasons[2]] == ["runtime_not_installed"]
    assert [r["code"] for r in reasons[3]] == ["node_unavailable"]
    assert "registered" in reasons[3][0]["message"]
    assert [r["code"] for r in reasons[4]] == ["node_not_found"]

    # Submitting the same specification is refused with the same reasons, writing nothing.
    response = await controller.call("POST", "/api/v1/inference", json=spec)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "placement_failed"
    assert "node gpu-1" in error["message"]
    assert len(error["details"]["reasons"]) == sum(len(r) for r in reasons.values())
    assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"engine": "no_such_engine"}, "$.engine"),
        ({"runtime": {"network": "host"}}, "$.runtime.network"),
        ({"tensor_split": [1, 1, 1]}, "$.tensor_split"),
        ({"gpu_layers": 99, "placements": "cpu"}, "$.gpu_layers"),
        ({"context": 0}, "$.context"),
        ({"colour": "blue"}, "$.colour"),
        ({"placements": []}, "$.placements"),
    ],
)
async def test_an_invalid_specification_is_refused_at_its_field_path(controller, change, path):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    spec = _spec(model_id, _placement("gpu-1", gpus=[(0, GIB), (1, GIB)]))
    for key, value in change.items():
        if key == "runtime":
            spec["runtime"] = {**spec["runtime"], **value}
        elif key == "placements" and value == "cpu":
            spec["placements"] = [_placement("gpu-1")]
        else:
            spec[key] = value
    for route in ("/api/v1/inference/preview", "/api/v1/inference"):
        response = await controller.call("POST", route, json=spec)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert path in [e["path"] for e in error["details"]["errors"]], error
    assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []


async def test_a_model_must_be_a_verified_model_of_this_project(controller):
    await _gpu_node(controller, "gpu-1")
    unverified = await _tiny_model(controller, "pending", upload=False)
    for model_id, words in ((unverified, "not verified"), ("mdl_nope", "no model")):
        response = await controller.call(
            "POST", "/api/v1/inference", json=_spec(model_id, _placement("gpu-1"))
        )
        assert response.status_code == 400
        [error] = response.json()["error"]["details"]["errors"]
        assert error["path"] == "$.model_id"
        assert words in error["message"]


@pytest.mark.deadline(40)
async def test_concurrent_submits_never_over_commit_the_last_gpu_slice(controller):
    await _gpu_node(controller, "gpu-1", gpus=(80 * GIB,))
    model_id = await _tiny_model(controller)
    first = _spec(model_id, _placement("gpu-1", cpus=1, memory=GIB, gpus=[(0, 50 * GIB)]))
    await controller.ok("POST", "/api/v1/inference", status=201, json={**first, "alias": "big"})
    # 30 GiB are left on GPU 0: three of twelve 10 GiB submits fit.
    outcomes: dict[str, int] = {}

    async def submit(index: int) -> None:
        spec = _spec(
            model_id,
            _placement("gpu-1", cpus=0.5, memory=GIB, gpus=[(0, 10 * GIB)]),
            alias=f"svc-{index}",
        )
        response = await controller.call("POST", "/api/v1/inference", json=spec)
        outcomes[spec["alias"]] = response.status_code
        if response.status_code == 409:
            assert response.json()["error"]["code"] == "placement_failed"

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for index in range(12):
                nursery.start_soon(submit, index)
    assert sorted(outcomes.values()) == [201] * 3 + [409] * 9
    node = (await controller.ok("POST", "/api/v1/inference/preview", json=first))["nodes"][0]
    assert node["gpus"][0]["reserved"] == 80 * GIB
    listed = await controller.node("gpu-1")
    assert sorted(r["gpus"][0]["memory_bytes"] for r in listed["reservations"]) == [
        10 * GIB
    ] * 3 + [50 * GIB]


@pytest.mark.deadline(40)
async def test_concurrent_submits_never_over_commit_node_memory(controller):
    await _gpu_node(controller, "cpu-1", gpus=(), cpus=8, memory_bytes=10 * GIB)
    model_id = await _tiny_model(controller)
    results = []

    async def submit(index: int) -> None:
        spec = _spec(model_id, _placement("cpu-1", cpus=1, memory=3 * GIB), alias=f"m-{index}")
        results.append((await controller.call("POST", "/api/v1/inference", json=spec)).status_code)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for index in range(8):
                nursery.start_soon(submit, index)
    assert sorted(results) == [201] * 3 + [409] * 5


async def test_an_alias_is_unique_in_a_project_and_a_used_model_cannot_be_deleted(controller):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    spec = _spec(model_id, _placement("gpu-1"))
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    response = await controller.call("POST", "/api/v1/inference", json=spec)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "service_exists"
    response = await controller.call("DELETE", f"/api/v1/models/{model_id}")
    assert response.status_code == 409
    assert response.json()["error"]["details"]["services"] == [created["id"]]


async def test_control_refuses_transitions_that_do_not_apply(controller):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    created = await controller.ok(
        "POST", "/api/v1/inference", status=201, json=_spec(model_id, _placement("gpu-1"))
    )
    service_id = created["id"]
    response = await controller.control(service_id, "drain")
    assert (response.status_code, response.json()["error"]["code"]) == (409, "invalid_transition")
    response = await controller.control(service_id, "restart")
    assert response.status_code == 404
    # A stopped service stopping again changes nothing, and keeps its revision.
    response = await controller.control(service_id, "stop")
    assert response.status_code == 200
    assert response.json()["revision"] == created["revision"]
    response = await controller.control(service_id, "remove", acknowledge_unknown=True)
    assert (response.status_code, response.json()["error"]["code"]) == (
        400,
        "acknowledge_not_allowed",
    )
    other = await issue_token(controller.service, project="default", scopes=ALL_SCOPES)
    response = await controller.call("GET", f"/api/v1/inference/{service_id}", token=other)
    assert response.status_code == 200
    # Another project's service does not exist for this caller.
    await controller.service.auth.create_project("elsewhere")
    stranger = await issue_token(controller.service, project="elsewhere", scopes=ALL_SCOPES)
    response = await controller.call("GET", f"/api/v1/inference/{service_id}", token=stranger)
    assert (response.status_code, response.json()["error"]["code"]) == (404, "service_not_found")


@pytest.mark.parametrize(
    ("action", "missing"),
    [
        ("create", "jobs:execute"),
        ("create", "contributors:read"),
        ("create", "models:read"),
        ("replace", "jobs:execute"),
        ("replace", "contributors:read"),
        ("replace", "models:read"),
        ("start", "jobs:execute"),
        ("start", "contributors:read"),
        ("start", "models:read"),
        ("stop", "jobs:cancel"),
        ("remove", "jobs:cancel"),
        ("drain", "jobs:cancel"),
    ],
)
async def test_the_scope_matrix_of_state_changes(controller, action, missing):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    spec = _spec(model_id, _placement("gpu-1"))
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    token = await issue_token(
        controller.service, scopes=set(ALL_SCOPES) - {missing}, name=f"no-{missing}"
    )
    body = {"revision": created["revision"]}
    if action == "create":
        response = await controller.call(
            "POST", "/api/v1/inference", token=token, json={**spec, "alias": "other"}
        )
    elif action == "replace":
        response = await controller.call(
            "PUT", f"/api/v1/inference/{created['id']}", token=token, json={**body, "spec": spec}
        )
    else:
        response = await controller.call(
            "POST", f"/api/v1/inference/{created['id']}/control/{action}", token=token, json=body
        )
    assert response.status_code == 403, response.text
    assert response.json()["error"]["details"]["missing"] == [missing]
    after = await controller.ok("GET", f"/api/v1/inference/{created['id']}")
    assert after["revision"] == created["revision"]


async def test_an_invoke_token_is_bound_to_its_service_shown_once_and_revocable(controller):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    created = await controller.ok(
        "POST", "/api/v1/inference", status=201, json=_spec(model_id, _placement("gpu-1"))
    )
    service_id = created["id"]
    issued = await controller.ok(
        "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 3600}
    )
    token = issued["token"]
    credential = issued["credential"]
    assert credential["scopes"] == ["inference:invoke"]
    assert credential["service_id"] == service_id
    assert 3590 < credential["expires_at"] - credential["created_at"] <= 3600
    listed = await controller.ok("GET", f"/api/v1/inference/{service_id}/tokens")
    assert [t["id"] for t in listed["tokens"]] == [credential["id"]]
    assert "token" not in listed["tokens"][0]
    # Stored hashed: the secret is nowhere in the database.
    secret = token.split(".", 1)[1]
    rows = await controller.service.store.read(
        lambda tx: tx.fetch_all("SELECT * FROM credentials WHERE id = ?", (credential["id"],))
    )
    assert secret not in repr(rows)
    # It invokes, nothing else: management routes are refused.
    whoami = await controller.ok("GET", "/api/v1/whoami", token=token)
    assert whoami["service_id"] == service_id
    response = await controller.call("GET", f"/api/v1/inference/{service_id}", token=token)
    assert response.status_code == 403
    for lifetime in (0, -5, "soon"):
        response = await controller.call(
            "POST", f"/api/v1/inference/{service_id}/tokens", json={"lifetime": lifetime}
        )
        assert response.status_code == 400
    revoked = await controller.ok(
        "DELETE", f"/api/v1/inference/{service_id}/tokens/{credential['id']}"
    )
    assert revoked["revoked_at"] is not None
    response = await controller.call("GET", "/api/v1/whoami", token=token)
    assert (response.status_code, response.json()["error"]["code"]) == (401, "credential_revoked")
    # Only this service's tokens are revocable through this route.
    project_token = (await controller.ok("GET", "/api/v1/tokens"))["tokens"][0]["id"]
    response = await controller.call(
        "DELETE", f"/api/v1/inference/{service_id}/tokens/{project_token}"
    )
    assert response.status_code == 404


async def test_an_invoke_token_never_outlives_the_credential_that_issued_it(controller):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    created = await controller.ok(
        "POST", "/api/v1/inference", status=201, json=_spec(model_id, _placement("gpu-1"))
    )
    service_id = created["id"]
    scopes = ["inference:manage", "inference:invoke", "tokens:manage"]
    issuer = await controller.ok(
        "POST",
        "/api/v1/tokens",
        status=201,
        json={"name": "short", "scopes": scopes, "lifetime": 60},
    )
    issued = await controller.ok(
        "POST",
        f"/api/v1/inference/{service_id}/tokens",
        status=201,
        token=issuer["token"],
        json={"lifetime": 30 * 86400},
    )
    credential = issued["credential"]
    assert credential["expires_at"] == issuer["credential"]["expires_at"]
    assert credential["capped"] == {
        "requested": 30 * 86400,
        "granted": pytest.approx(60, abs=1),
        "by": "issuer_expiry",
    }
    # Revoking the issuer revokes the invoke token it minted.
    await controller.ok("DELETE", f"/api/v1/tokens/{issuer['credential']['id']}")
    response = await controller.call("GET", "/api/v1/whoami", token=issued["token"])
    assert (response.status_code, response.json()["error"]["code"]) == (401, "credential_revoked")


async def test_a_start_arriving_while_the_driver_settles_a_stop_is_acted_on(
    controller, monkeypatch
):
    # The driver of a just-submitted (stopped) service finishes once it has settled;
    # a start recorded while it settles must be acted on, never lost in between.
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    reconciler = controller.service.reconciler
    settling = trio.Event()
    original = reconciler._stop_all

    async def slow_stop_all(*args, **kwargs):
        result = await original(*args, **kwargs)
        settling.set()
        await trio.sleep(0.2)  # the window in which the start arrives
        return result

    monkeypatch.setattr(reconciler, "_stop_all", slow_stop_all)
    spec = _spec(model_id, _placement("gpu-1"))
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    with trio.fail_after(10):
        await settling.wait()
        response = await controller.control(created["id"], "start", revision=created["revision"])
        assert response.status_code == 200, response.text
        # The node cannot be reached, so the attempt fails; what matters is that one is made.
        await controller.wait_service(
            created["id"], lambda v: v["replicas"][0]["attempt"] is not None
        )
