"""Specification, runtime, placement and resource-limit rules."""

import attrs
import pytest

from ficc_core.schema import (
    GpuRequest,
    Placement,
    ResourceLimits,
    Runtime,
    SchemaError,
    Specification,
    structure,
    unstructure,
)

D1 = "sha256:" + "1" * 64
RUNTIME = {
    "executor_provider": "process",
    "image_digest": D1,
    "isolation": "process",
    "package_digest": D1,
}
LIMITS = {"cpus": 1.0, "memory_bytes": 1024}
SPECIFICATION = {
    "alias": "smollm",
    "concurrency": 1,
    "context": 2048,
    "engine": "llama_cpp",
    "image_executable": "llama-server",
    "model_id": "mdl-1",
    "placements": [{"limits": LIMITS, "node_id": "node-a"}],
    "runtime": RUNTIME,
}


def _runtime(**changes: object) -> Runtime:
    return Runtime(**{**RUNTIME, **changes})


def _refusal(document: dict, cls: type = Specification) -> dict[str, str]:
    with pytest.raises(SchemaError) as caught:
        structure(document, cls)
    [error] = caught.value.errors
    return error


def test_runtime_network_defaults_to_none():
    assert structure(RUNTIME, Runtime).network == "none"


def test_specification_refuses_a_runtime_with_network():
    error = _refusal({**SPECIFICATION, "runtime": {**RUNTIME, "network": "host"}})
    assert error["path"] == "$.runtime.network"
    assert error["message"].startswith('must be "none" for a managed inference service')


def test_runtime_alone_may_name_a_network():
    # Contributor workloads use runtimes too; only a managed service insists on "none".
    assert _runtime(network="bridge").network == "bridge"


@pytest.mark.parametrize(
    "bad", ["sha256:" + "A" * 64, "sha256:" + "1" * 63, "sha512:" + "1" * 64, "1" * 64, ""]
)
def test_runtime_refuses_a_malformed_image_digest(bad):
    error = _refusal({**RUNTIME, "image_digest": bad}, Runtime)
    assert error["path"] == "$.image_digest"
    assert "64 lowercase hexadecimal digits" in error["message"]


def test_runtime_refuses_a_malformed_package_digest():
    assert _refusal({**RUNTIME, "package_digest": "latest"}, Runtime)["path"] == (
        "$.package_digest"
    )


@pytest.mark.parametrize("bad", ["Process", "", "1proc", "pro cess"])
def test_runtime_refuses_a_provider_that_is_not_an_identifier(bad):
    assert _refusal({**RUNTIME, "executor_provider": bad}, Runtime)["path"] == (
        "$.executor_provider"
    )


def test_specification_refuses_empty_placements():
    assert _refusal({**SPECIFICATION, "placements": []}) == {
        "path": "$.placements",
        "message": "must list at least one placement",
    }


@pytest.mark.parametrize("alias", ["a", "smollm2:135m", "Qwen2.5-7B_instruct", "x" * 64])
def test_specification_accepts_aliases(alias):
    assert structure({**SPECIFICATION, "alias": alias}, Specification).alias == alias


@pytest.mark.parametrize("alias", ["", "-lead", "has space", "x" * 65, "modèle", "a/b"])
def test_specification_refuses_bad_aliases(alias):
    assert _refusal({**SPECIFICATION, "alias": alias})["path"] == "$.alias"


@pytest.mark.parametrize(("field", "maximum"), [("context", 2**24), ("concurrency", 4096)])
def test_specification_refuses_counts_out_of_range(field, maximum):
    assert getattr(structure({**SPECIFICATION, field: maximum}, Specification), field) == maximum
    for value in (0, maximum + 1, 10**400):
        assert _refusal({**SPECIFICATION, field: value})["path"] == f"$.{field}"
    assert _refusal({**SPECIFICATION, field: 0}) == {
        "path": f"$.{field}",
        "message": f"must be from 1 to {maximum}, got 0",
    }


def test_specification_refuses_an_empty_image_executable():
    assert _refusal({**SPECIFICATION, "image_executable": ""}) == {
        "path": "$.image_executable",
        "message": "must not be empty",
    }


def test_specification_refuses_nul_in_image_executable():
    assert _refusal({**SPECIFICATION, "image_executable": "llama\x00"})["path"] == (
        "$.image_executable"
    )


def test_gpu_layers_may_be_zero_but_not_negative():
    assert structure({**SPECIFICATION, "gpu_layers": 0}, Specification).gpu_layers == 0
    assert _refusal({**SPECIFICATION, "gpu_layers": -1})["path"] == "$.gpu_layers"


def test_tensor_split_accepts_zero_shares_beside_a_positive_one():
    spec = structure({**SPECIFICATION, "tensor_split": [0, 1, 2.5]}, Specification)
    assert spec.tensor_split == (0.0, 1.0, 2.5)


def test_tensor_split_refuses_all_zero_shares():
    assert _refusal({**SPECIFICATION, "tensor_split": [0, 0.0]}) == {
        "path": "$.tensor_split",
        "message": "must give at least one GPU a share above 0",
    }


def test_tensor_split_refuses_a_negative_share():
    assert _refusal({**SPECIFICATION, "tensor_split": [1, -0.5]})["path"] == "$.tensor_split[1]"


def test_tensor_split_refuses_an_empty_list():
    assert _refusal({**SPECIFICATION, "tensor_split": []})["path"] == "$.tensor_split"


def test_a_prompt_cache_is_zero_to_a_pebibyte_and_leaves_the_digest_alone_when_absent():
    # Its MiB count must fit the 32-bit integer llama-server parses --cache-ram into.
    base = structure(SPECIFICATION, Specification)
    assert base.prompt_cache_bytes is None and "prompt_cache_bytes" not in unstructure(base)
    for value in (0, 2**50):
        spec = structure({**SPECIFICATION, "prompt_cache_bytes": value}, Specification)
        assert spec.prompt_cache_bytes == value and spec.digest() != base.digest()
    for value in (-1, 2**50 + 1, 1.5, "512"):
        assert _refusal({**SPECIFICATION, "prompt_cache_bytes": value})["path"] == (
            "$.prompt_cache_bytes"
        )


def test_parallelism_must_be_at_least_one():
    assert _refusal({**SPECIFICATION, "parallelism": 0})["path"] == "$.parallelism"


@pytest.mark.parametrize("deadline", [0, -1.5])
def test_request_deadline_must_be_positive(deadline):
    assert _refusal({**SPECIFICATION, "request_deadline": deadline})["path"] == (
        "$.request_deadline"
    )


def test_request_deadline_refuses_infinity_built_in_python():
    spec = structure(SPECIFICATION, Specification)
    with pytest.raises(ValueError, match="must be a finite number") as caught:
        attrs.evolve(spec, request_deadline=float("inf"))
    assert caught.value.field == "request_deadline"


@pytest.mark.parametrize("node_id", ["node-a", "10.0.0.7", "N_1", "x" * 63])
def test_placement_accepts_node_ids(node_id):
    assert Placement(node_id=node_id, limits=ResourceLimits(cpus=1, memory_bytes=1)).node_id


@pytest.mark.parametrize("node_id", ["", "-a", ".a", "a b", "a/b", "x" * 64])
def test_placement_refuses_bad_node_ids(node_id):
    document = {"limits": LIMITS, "node_id": node_id}
    assert _refusal(document, Placement)["path"] == "$.node_id"


@pytest.mark.parametrize(("field", "value"), [("cpus", -1.0), ("memory_bytes", 0)])
def test_limits_refuse_non_positive_sizes(field, value):
    assert _refusal({**LIMITS, field: value}, ResourceLimits)["path"] == f"$.{field}"


@pytest.mark.parametrize("field", ["pids", "open_files"])
def test_limits_refuse_zero_process_and_file_limits(field):
    assert _refusal({**LIMITS, field: 0}, ResourceLimits)["path"] == f"$.{field}"


def test_limits_refuse_the_same_gpu_twice():
    gpus = [{"index": 1, "memory_bytes": 1}, {"index": 1, "memory_bytes": 2}]
    assert _refusal({**LIMITS, "gpus": gpus}, ResourceLimits)["path"] == "$.gpus[1].index"


def test_gpu_request_refuses_a_negative_index():
    assert _refusal({"index": -1, "memory_bytes": 1}, GpuRequest)["path"] == "$.index"


def test_limits_built_in_python_store_cpus_as_float():
    assert ResourceLimits(cpus=2, memory_bytes=1).cpus == 2.0
    assert isinstance(ResourceLimits(cpus=2, memory_bytes=1).cpus, float)


def test_limits_built_in_python_refuse_a_string_for_cpus():
    with pytest.raises(ValueError, match="must be a finite number, got string"):
        ResourceLimits(cpus="2", memory_bytes=1)


def test_limits_built_in_python_refuse_a_bool_for_memory():
    with pytest.raises(ValueError, match="must be an integer, got true") as caught:
        ResourceLimits(cpus=1, memory_bytes=True)
    assert caught.value.field == "memory_bytes"


def test_specification_built_in_python_takes_a_list_of_placements_as_a_tuple():
    placement = Placement(node_id="n", limits=ResourceLimits(cpus=1, memory_bytes=1))
    spec = attrs.evolve(structure(SPECIFICATION, Specification), placements=[placement])
    assert spec.placements == (placement,)


def test_specification_digest_changes_with_its_content():
    spec = structure(SPECIFICATION, Specification)
    other = structure({**SPECIFICATION, "context": 4096}, Specification)
    assert spec.digest().startswith("sha256:")
    assert spec.digest() != other.digest()


@pytest.mark.parametrize("idle", [0.001, 1, 9.99])
def test_an_idle_timeout_below_ten_seconds_is_refused_naming_the_field_and_the_minimum(idle):
    with pytest.raises(SchemaError) as raised:
        structure({**SPECIFICATION, "scaling": {"idle_timeout": idle}}, Specification)
    [error] = raised.value.details["errors"]
    assert error["path"] == "$.scaling.idle_timeout"
    assert error["message"].startswith("must be from 10 to 604800"), error["message"]
    ten = structure({**SPECIFICATION, "scaling": {"idle_timeout": 10}}, Specification)
    assert ten.scaling is not None and ten.scaling.idle_timeout == 10.0
