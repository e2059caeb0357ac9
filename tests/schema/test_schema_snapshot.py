"""Executor snapshots and contributor workloads: what older peers omit stays omitted."""

import pytest

from ficc_core.schema import (
    EndpointContract,
    ExecutorSnapshot,
    Fence,
    ResourceLimits,
    Runtime,
    SchemaError,
    Workload,
    canonical_json,
    structure,
    unstructure,
)

D1 = "sha256:" + "1" * 64
OLD_SNAPSHOT = {
    "node_id": "node-a",
    "providers": [{"name": "process", "package_digest": D1}],
    "resources": {"cpus": 2, "disk_free_bytes": 0, "memory_bytes": 1024},
}


def _refusal(document: dict, cls: type = ExecutorSnapshot) -> dict[str, str]:
    with pytest.raises(SchemaError) as caught:
        structure(document, cls)
    [error] = caught.value.errors
    return error


def _workload(**changes: object) -> Workload:
    runtime = Runtime(
        executor_provider="container", package_digest=D1, image_digest=D1, isolation="container"
    )
    fields = {
        "workload_id": "wl-1",
        "project_id": "proj-1",
        "node_id": "node-a",
        "runtime": runtime,
        "argv": ["worker"],
        "limits": ResourceLimits(cpus=1, memory_bytes=1024),
        "generation": 1,
    }
    return Workload(**{**fields, **changes})


def test_snapshot_without_endpoint_version_is_accepted():
    snapshot = structure(OLD_SNAPSHOT, ExecutorSnapshot)
    assert snapshot.endpoint_version is None


def test_snapshot_without_endpoint_version_does_not_support_inference():
    assert not structure(OLD_SNAPSHOT, ExecutorSnapshot).supports_inference


def test_snapshot_without_endpoint_version_serialises_without_the_key():
    snapshot = structure(OLD_SNAPSHOT, ExecutorSnapshot)
    assert "endpoint_version" not in unstructure(snapshot)
    assert b"endpoint_version" not in canonical_json(snapshot)


def test_snapshot_with_endpoint_version_1_supports_inference():
    snapshot = structure({**OLD_SNAPSHOT, "endpoint_version": 1}, ExecutorSnapshot)
    assert snapshot.supports_inference


def test_snapshot_with_a_later_endpoint_version_does_not_support_inference():
    snapshot = structure({**OLD_SNAPSHOT, "endpoint_version": 2}, ExecutorSnapshot)
    assert not snapshot.supports_inference


def test_snapshot_refuses_endpoint_version_zero():
    assert _refusal({**OLD_SNAPSHOT, "endpoint_version": 0})["path"] == "$.endpoint_version"


def test_snapshot_refuses_the_same_gpu_index_twice():
    gpus = [
        {"index": 0, "memory_bytes": 1, "name": "a"},
        {"index": 0, "memory_bytes": 1, "name": "b"},
    ]
    resources = {**OLD_SNAPSHOT["resources"], "gpus": gpus}
    assert _refusal({**OLD_SNAPSHOT, "resources": resources})["path"] == (
        "$.resources.gpus[1].index"
    )


def test_snapshot_refuses_negative_free_disk():
    resources = {**OLD_SNAPSHOT["resources"], "disk_free_bytes": -1}
    assert _refusal({**OLD_SNAPSHOT, "resources": resources})["path"] == (
        "$.resources.disk_free_bytes"
    )


def test_snapshot_refuses_a_malformed_provider_digest():
    providers = [{"name": "process", "package_digest": "sha256:short"}]
    assert _refusal({**OLD_SNAPSHOT, "providers": providers})["path"] == (
        "$.providers[0].package_digest"
    )


def test_snapshot_refuses_a_bad_label_name():
    assert _refusal({**OLD_SNAPSHOT, "labels": {"bad name": "x"}})["path"] == (
        "$.labels['bad name']"
    )


def test_snapshot_accepts_labels():
    labels = {"zone": "lab-1", "gpu.vendor/name": "nvidia"}
    assert structure({**OLD_SNAPSHOT, "labels": labels}, ExecutorSnapshot).labels == labels


def test_legacy_workload_serialises_without_the_new_fields():
    document = unstructure(_workload())
    assert "model_revision" not in document
    assert "endpoint" not in document


def test_replica_serialises_its_model_revision_and_endpoint():
    endpoint = EndpointContract.unix(["/v1/chat/completions"])
    document = unstructure(_workload(model_revision="rev-3", endpoint=endpoint))
    assert document["model_revision"] == "rev-3"
    assert document["endpoint"]["paths"] == ["/v1/chat/completions"]


def test_workload_refuses_generation_zero():
    with pytest.raises(ValueError, match="must be from 1 to 9007199254740991, got 0") as caught:
        _workload(generation=0)
    assert caught.value.field == "generation"


def test_workload_fence_carries_its_generation_and_plan_digest():
    workload = _workload(generation=4)
    assert workload.fence("att-9") == Fence(
        attempt_id="att-9", generation=4, plan_digest=workload.plan_digest()
    )


def test_workload_refuses_unknown_fields_at_their_path():
    document = {**unstructure(_workload()), "endpoint": {"paths": ["/"], "extra": 1}}
    assert _refusal(document, Workload) == {"path": "$.endpoint.extra", "message": "unknown field"}


def _with_runtime(**fields: object) -> dict:
    runtime = {
        "name": "llama_server",
        "executor_provider": "process",
        "package_digest": D1,
        "image_digest": D1,
        **fields,
    }
    return {**OLD_SNAPSHOT, "runtimes": [runtime]}


def test_a_runtime_without_the_later_fields_serialises_without_their_keys():
    document = _with_runtime()
    assert unstructure(structure(document, ExecutorSnapshot))["runtimes"] == document["runtimes"]


def test_a_runtime_carries_what_a_specification_binds_for_it():
    document = _with_runtime(
        engines=["llama_cpp"],
        executable="/opt/bin/llama-server",
        isolation="process",
        network="none",
    )
    snapshot = structure(document, ExecutorSnapshot)
    assert snapshot.runtimes[0].engines == ("llama_cpp",)
    assert unstructure(snapshot)["runtimes"] == document["runtimes"]


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"engines": ["Llama CPP"]}, "$.runtimes[0].engines"),
        ({"engines": "llama_cpp"}, "$.runtimes[0].engines"),
        ({"executable": ""}, "$.runtimes[0].executable"),
        ({"isolation": "Process"}, "$.runtimes[0].isolation"),
    ],
)
def test_a_runtime_refuses_malformed_later_fields(fields, path):
    assert _refusal(_with_runtime(**fields))["path"] == path


# -- protocol versions: a newer agent's optional fields are ignored, known ones never bent --


def test_a_newer_minor_versions_unknown_fields_are_left_out_and_named():
    from ficc_core.schema.snapshot import snapshot_from_wire

    newer = {
        **OLD_SNAPSHOT,
        "protocol_version": "1.2",
        "power_watts": 300,
        "resources": {**OLD_SNAPSHOT["resources"], "numa": [0, 1]},
        "providers": [{**OLD_SNAPSHOT["providers"][0], "flavour": "x"}],
    }
    snapshot, dropped = snapshot_from_wire(newer)
    assert dropped == ["$.providers[0].flavour", "$.resources.numa", "$.power_watts"]
    assert snapshot.resources.cpus == 2.0 and snapshot.providers[0].name == "process"
    # The version belongs to the wire: what the controller stores leaves it out.
    assert unstructure(snapshot) == unstructure(structure(OLD_SNAPSHOT, ExecutorSnapshot))


def test_the_same_unknown_fields_from_this_version_or_older_are_refused_as_ever():
    from ficc_core.schema.snapshot import snapshot_from_wire

    for version in ("1.1", "1.0", None, "2.0"):
        document = {**OLD_SNAPSHOT, "power_watts": 300}
        if version is not None:
            document["protocol_version"] = version
        with pytest.raises(SchemaError) as caught:
            snapshot_from_wire(document)
        assert caught.value.errors == [{"path": "$.power_watts", "message": "unknown field"}]


def test_a_newer_agent_s_known_field_is_checked_as_strictly_as_ever():
    from ficc_core.schema.snapshot import snapshot_from_wire

    newer = {
        **OLD_SNAPSHOT,
        "protocol_version": "1.2",
        "endpoint_version": "1",
        "resources": {**OLD_SNAPSHOT["resources"], "cpus": -1},
    }
    with pytest.raises(SchemaError) as caught:
        snapshot_from_wire(newer)
    paths = sorted(error["path"] for error in caught.value.errors)
    assert paths == ["$.endpoint_version", "$.resources.cpus"]


def test_a_stored_snapshot_with_a_newer_controller_s_fields_is_read():
    from ficc_core.schema.snapshot import stored_snapshot

    stored = {**OLD_SNAPSHOT, "endpoint_version": 1, "power_watts": 300}
    assert stored_snapshot(stored).endpoint_version == 1


def test_the_snapshot_s_version_is_the_node_protocol_s():
    from ficc_core.nodelink.wire import PROTOCOL_VERSION, protocol_version
    from ficc_core.schema.snapshot import SNAPSHOT_VERSION

    assert protocol_version(PROTOCOL_VERSION) == SNAPSHOT_VERSION
