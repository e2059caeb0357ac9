"""The data model's wire rules: strict structuring, field paths, canonical JSON, digests."""

import hashlib
import json

import attrs
import pytest

from ficc_core.schema import (
    EndpointContract,
    ExecutorSnapshot,
    Fence,
    GpuDevice,
    GpuRequest,
    InstalledRuntime,
    Job,
    JobInput,
    ModelFile,
    ModelManifest,
    ModelSource,
    NodeResources,
    Placement,
    ProviderInfo,
    ReadinessProbe,
    ResourceLimits,
    Runtime,
    SchemaError,
    Specification,
    Workload,
    canonical_json,
    digest,
    structure,
    unstructure,
)

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
HEX = "ab" * 32

RUNTIME = {
    "executor_provider": "process",
    "image_digest": D2,
    "isolation": "process",
    "network": "none",
    "package_digest": D1,
}
LIMITS = {"cpus": 2.0, "gpus": [], "memory_bytes": 1073741824}
GPU_LIMITS = {
    "cpus": 4.5,
    "gpus": [{"index": 0, "memory_bytes": 8589934592}, {"index": 1, "memory_bytes": 1024}],
    "memory_bytes": 1073741824,
    "open_files": 4096,
    "pids": 512,
}
SPECIFICATION = {
    "alias": "smollm",
    "concurrency": 2,
    "context": 2048,
    "engine": "llama_cpp",
    "image_executable": "/opt/llama/llama-server",
    "model_id": "mdl-1",
    "placements": [{"limits": LIMITS, "node_id": "node-a"}],
    "runtime": RUNTIME,
}
FULL_SPECIFICATION = {
    **SPECIFICATION,
    "gpu_layers": 99,
    "parallelism": 2,
    "placements": [{"limits": GPU_LIMITS, "node_id": "gpu-1"}],
    "request_deadline": 30.0,
    "tensor_split": [0.75, 0.25],
}
MANIFEST = {
    "files": [{"path": "model.gguf", "sha256": HEX, "size": 98, "url": "https://h.example/m"}],
    "format": "gguf",
    "licence": "apache-2.0",
    "name": "SmolLM2 135M",
    "source": {"repository": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "main"},
}
ENDPOINT = {
    "paths": ["/v1/chat/completions", "/v1/models"],
    "socket": "engine.sock",
    "transport": "unix",
    "version": 1,
}
JOB = {
    "argv": ["llama-server", "--model", "/blobs/m.gguf"],
    "capabilities": ["chat", "streaming"],
    "endpoint": ENDPOINT,
    "env": {"LLAMA_ARG_THREADS": "2"},
    "inputs": [{"digest": D1, "id": "model", "path": "/blobs/m.gguf"}],
    "readiness": {"interval": 0.5, "path": "/health", "timeout": 600.0},
}
LEGACY_WORKLOAD = {
    "argv": ["worker"],
    "generation": 1,
    "limits": LIMITS,
    "node_id": "node-a",
    "project_id": "proj-1",
    "runtime": RUNTIME,
    "workload_id": "wl-1",
}
SNAPSHOT = {
    "endpoint_version": 1,
    "labels": {"zone": "lab"},
    "node_id": "node-a",
    "providers": [{"name": "process", "package_digest": D1}],
    "resources": {
        "cpus": 16.0,
        "disk_free_bytes": 10,
        "gpus": [{"index": 0, "memory_bytes": 141, "name": "H200"}],
        "memory_bytes": 128,
    },
    "runtimes": [
        {
            "executor_provider": "process",
            "image_digest": D2,
            "name": "llama_server",
            "package_digest": D1,
        }
    ],
}

# Each document is already in canonical form: every emitted field, floats as floats.
DOCUMENTS = [
    (GpuRequest, {"index": 0, "memory_bytes": 1}),
    (ResourceLimits, LIMITS),
    (ResourceLimits, GPU_LIMITS),
    (Placement, {"limits": LIMITS, "node_id": "node-a"}),
    (Runtime, RUNTIME),
    (Specification, SPECIFICATION),
    (Specification, FULL_SPECIFICATION),
    (ModelSource, MANIFEST["source"]),
    (ModelFile, {"path": "dir/config.json", "sha256": HEX, "size": 0}),
    (ModelManifest, MANIFEST),
    (Fence, {"attempt_id": "att-1", "generation": 2, "plan_digest": D1}),
    (EndpointContract, ENDPOINT),
    (EndpointContract, {**ENDPOINT, "port": 8080, "transport": "tcp"}),
    (ReadinessProbe, {"interval": 1.0, "path": "/ready", "timeout": 60.0}),
    (JobInput, {"id": "model", "path": "/blobs/m.gguf"}),
    (Job, JOB),
    (Workload, LEGACY_WORKLOAD),
    (Workload, {**LEGACY_WORKLOAD, "endpoint": ENDPOINT, "model_revision": "rev-2"}),
    (ProviderInfo, {"name": "container", "package_digest": D2}),
    (GpuDevice, {"index": 3, "memory_bytes": 0, "name": "NVIDIA H200"}),
    (NodeResources, SNAPSHOT["resources"]),
    (InstalledRuntime, SNAPSHOT["runtimes"][0]),
    (ExecutorSnapshot, SNAPSHOT),
]


def _id(param: object) -> str:
    return param.__name__ if isinstance(param, type) else ""


def _errors(data: object, cls: type) -> list[dict[str, str]]:
    with pytest.raises(SchemaError) as caught:
        structure(data, cls)
    return caught.value.errors


@pytest.mark.parametrize(("cls", "document"), DOCUMENTS, ids=_id)
def test_unstructure_returns_the_structured_document(cls, document):
    assert unstructure(structure(document, cls)) == document


@pytest.mark.parametrize(("cls", "document"), DOCUMENTS, ids=_id)
def test_structure_of_unstructure_is_the_same_object(cls, document):
    obj = structure(document, cls)
    assert structure(unstructure(obj), cls) == obj


@pytest.mark.parametrize(("cls", "document"), DOCUMENTS, ids=_id)
def test_canonical_json_survives_a_json_round_trip(cls, document):
    obj = structure(document, cls)
    assert canonical_json(structure(json.loads(canonical_json(obj)), cls)) == canonical_json(obj)


@pytest.mark.parametrize(("cls", "document"), DOCUMENTS, ids=_id)
def test_every_class_is_frozen(cls, document):
    obj = structure(document, cls)
    name = attrs.fields(cls)[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(obj, name, getattr(obj, name))


def test_unknown_key_is_refused_at_its_nested_path():
    placement = {"limits": {**LIMITS, "bogus": 1}, "node_id": "node-a"}
    document = {**SPECIFICATION, "placements": [placement]}
    assert _errors(document, Specification) == [
        {"path": "$.placements[0].limits.bogus", "message": "unknown field"}
    ]


def test_unknown_top_level_key_is_refused():
    assert _errors({**RUNTIME, "extra": True}, Runtime) == [
        {"path": "$.extra", "message": "unknown field"}
    ]


def test_every_unknown_key_is_listed():
    document = {**JOB, "endpoint": {**ENDPOINT, "b": 1, "a": 2}, "zzz": 0}
    paths = [error["path"] for error in _errors(document, Job)]
    assert paths == ["$.endpoint.a", "$.endpoint.b", "$.zzz"]


def test_unknown_key_in_a_list_item_is_refused_at_its_index():
    files = [MANIFEST["files"][0], {"path": "b", "sha256": HEX, "size": 1, "mode": 420}]
    assert _errors({**MANIFEST, "files": files}, ModelManifest) == [
        {"path": "$.files[1].mode", "message": "unknown field"}
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("context", "2048", "expected integer, got string"),
        ("context", True, "expected integer, got boolean"),
        ("context", 2048.0, "expected integer, got number"),
        ("concurrency", None, "expected integer, got null"),
        ("alias", 5, "expected string, got number"),
        ("placements", "node-a", "expected array, got string"),
        ("placements", {"node_id": "node-a"}, "expected array, got object"),
        ("runtime", [], "expected object, got array"),
        ("request_deadline", "30", "expected number, got string"),
        ("request_deadline", False, "expected number, got boolean"),
    ],
)
def test_wrong_json_type_is_refused_at_its_path(field, value, message):
    assert _errors({**SPECIFICATION, field: value}, Specification) == [
        {"path": f"$.{field}", "message": message}
    ]


def test_float_for_nested_int_is_refused_at_its_path():
    limits = {**LIMITS, "memory_bytes": 1.5}
    document = {**SPECIFICATION, "placements": [{"limits": limits, "node_id": "n"}]}
    assert _errors(document, Specification) == [
        {"path": "$.placements[0].limits.memory_bytes", "message": "expected integer, got number"}
    ]


def test_string_for_argv_is_not_split_into_characters():
    assert _errors({**JOB, "argv": "llama-server"}, Job) == [
        {"path": "$.argv", "message": "expected array, got string"}
    ]


def test_non_string_environment_value_is_refused_at_its_key():
    assert _errors({**JOB, "env": {"THREADS": 2}}, Job) == [
        {"path": "$.env['THREADS']", "message": "expected string, got number"}
    ]


def test_missing_required_field_is_reported():
    document = {key: value for key, value in SPECIFICATION.items() if key != "engine"}
    assert _errors(document, Specification) == [
        {"path": "$.engine", "message": "required field is missing"}
    ]


def test_literal_outside_its_choices_is_refused_with_the_choices():
    assert _errors({**MANIFEST, "format": "zip"}, ModelManifest) == [
        {"path": "$.format", "message": 'expected one of "gguf", "hf-directory", got "zip"'}
    ]


def test_non_object_document_is_refused():
    assert _errors([SPECIFICATION], Specification) == [
        {"path": "$", "message": "expected object, got array"}
    ]


def test_validator_refusal_is_reported_at_the_field_path():
    limits = {**LIMITS, "cpus": 0.0}
    document = {**SPECIFICATION, "placements": [{"limits": limits, "node_id": "n"}]}
    assert _errors(document, Specification) == [
        {
            "path": "$.placements[0].limits.cpus",
            "message": "must be more than 0 and at most 65536, got 0",
        }
    ]


def test_schema_error_message_names_the_first_path_and_counts_the_rest():
    with pytest.raises(SchemaError) as caught:
        structure({**SPECIFICATION, "context": "1", "concurrency": "2"}, Specification)
    assert caught.value.message == (
        "The request body is invalid at $.context: expected integer, got string (and 1 more)."
    )
    assert caught.value.code == "invalid_request"


def test_canonical_json_is_sorted_and_compact():
    limits = ResourceLimits(memory_bytes=1024, cpus=1, pids=8)
    assert canonical_json(limits) == b'{"cpus":1.0,"gpus":[],"memory_bytes":1024,"pids":8}'


def test_canonical_json_keeps_non_ascii_as_utf8():
    manifest = structure({**MANIFEST, "name": "Modèle 日本語"}, ModelManifest)
    encoded = canonical_json(manifest)
    assert '"name":"Modèle 日本語"'.encode() in encoded
    assert b"\\u" not in encoded


def test_canonical_json_writes_integral_floats_as_floats():
    assert canonical_json(ReadinessProbe(timeout=600, interval=1)) == canonical_json(
        ReadinessProbe(timeout=600.0, interval=1.0)
    )


def test_digest_is_sha256_of_canonical_json():
    manifest = structure(MANIFEST, ModelManifest)
    expected = "sha256:" + hashlib.sha256(canonical_json(manifest)).hexdigest()
    assert digest(manifest) == expected
    assert manifest.digest() == expected


@pytest.mark.parametrize(("cls", "document"), DOCUMENTS, ids=_id)
def test_digest_does_not_depend_on_key_order(cls, document):
    def reversed_keys(value):
        if isinstance(value, dict):
            return {key: reversed_keys(value[key]) for key in reversed(list(value))}
        if isinstance(value, list):
            return [reversed_keys(item) for item in value]
        return value

    assert digest(structure(reversed_keys(document), cls)) == digest(structure(document, cls))


def test_absent_optional_fields_are_omitted():
    spec = structure(SPECIFICATION, Specification)
    assert "gpu_layers" not in unstructure(spec)
    assert "tensor_split" not in unstructure(spec)
    assert "request_deadline" not in unstructure(spec)
    assert "pids" not in unstructure(spec.placements[0].limits)


# -- Golden: a legacy workload's canonical JSON and plan digest must never change --------

LEGACY_WORKLOAD_JSON = (
    b'{"argv":["llama-server","--port","0"],"generation":3,"limits":{"cpus":2.0,"gpus":[],'
    b'"memory_bytes":2147483648,"pids":256},"node_id":"node-a","project_id":"proj-1",'
    b'"runtime":{"executor_provider":"process","image_digest":"sha256:2222222222222222222222'
    b'222222222222222222222222222222222222222222","isolation":"process","network":"none",'
    b'"package_digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111"},'
    b'"workload_id":"wl-7f3a"}'
)
LEGACY_PLAN_DIGEST = "sha256:56b89708d594d95875a12ef711baad1eccccb776cc792e96062055c7634e703a"


def _legacy_workload() -> Workload:
    return structure(json.loads(LEGACY_WORKLOAD_JSON), Workload)


def test_golden_digest_is_sha256_of_the_golden_bytes():
    assert "sha256:" + hashlib.sha256(LEGACY_WORKLOAD_JSON).hexdigest() == LEGACY_PLAN_DIGEST


def test_legacy_workload_reserialises_to_the_same_bytes():
    assert canonical_json(_legacy_workload()) == LEGACY_WORKLOAD_JSON


def test_legacy_workload_keeps_its_plan_digest():
    assert _legacy_workload().plan_digest() == LEGACY_PLAN_DIGEST


def test_model_revision_changes_the_bytes_and_the_plan_digest():
    replica = attrs.evolve(_legacy_workload(), model_revision="rev-1")
    assert b'"model_revision":"rev-1"' in canonical_json(replica)
    assert replica.plan_digest() != LEGACY_PLAN_DIGEST


def test_endpoint_changes_the_bytes_and_the_plan_digest():
    endpoint = EndpointContract.unix(["/v1/chat/completions"])
    replica = attrs.evolve(_legacy_workload(), endpoint=endpoint)
    assert b'"endpoint":{"paths":["/v1/chat/completions"]' in canonical_json(replica)
    assert replica.plan_digest() != LEGACY_PLAN_DIGEST


def test_removing_the_new_fields_restores_the_legacy_bytes_and_digest():
    endpoint = EndpointContract.unix(["/v1/models"])
    replica = attrs.evolve(_legacy_workload(), model_revision="rev-1", endpoint=endpoint)
    legacy = attrs.evolve(replica, model_revision=None, endpoint=None)
    assert canonical_json(legacy) == LEGACY_WORKLOAD_JSON
    assert legacy.plan_digest() == LEGACY_PLAN_DIGEST
