"""Job, endpoint contract, readiness probe, input and fence rules."""

import attrs
import pytest

from ficc_core.schema import (
    BootstrapRequest,
    EndpointContract,
    Fence,
    Job,
    JobInput,
    ReadinessProbe,
    SchemaError,
    canonical_json,
    structure,
    unstructure,
)

D1 = "sha256:" + "1" * 64
ENDPOINT = {"paths": ["/v1/chat/completions"]}
JOB = {"argv": ["llama-server"], "endpoint": ENDPOINT}


def _refusal(document: dict, cls: type = Job) -> dict[str, str]:
    with pytest.raises(SchemaError) as caught:
        structure(document, cls)
    [error] = caught.value.errors
    return error


def _endpoint(**changes: object) -> dict:
    return {**ENDPOINT, **changes}


def test_endpoint_defaults_to_engine_sock_over_unix_version_1():
    endpoint = structure(ENDPOINT, EndpointContract)
    assert (endpoint.transport, endpoint.socket, endpoint.port, endpoint.version) == (
        "unix",
        "engine.sock",
        None,
        1,
    )


def test_endpoint_paths_are_sorted_and_deduplicated():
    paths = ["/v1/models", "/v1/chat/completions", "/v1/models"]
    endpoint = structure(_endpoint(paths=paths), EndpointContract)
    assert endpoint.paths == ("/v1/chat/completions", "/v1/models")


def test_endpoint_path_order_does_not_change_the_job_digest():
    first = structure({**JOB, "endpoint": {"paths": ["/a", "/b"]}}, Job)
    second = structure({**JOB, "endpoint": {"paths": ["/b", "/a"]}}, Job)
    assert first.digest() == second.digest()


def test_endpoint_admits_only_its_paths():
    endpoint = EndpointContract.unix(["/v1/embeddings"])
    assert endpoint.admits("/v1/embeddings")
    assert not endpoint.admits("/api/v1/models")


def test_endpoint_refuses_no_paths():
    assert _refusal(_endpoint(paths=[]), EndpointContract) == {
        "path": "$.paths",
        "message": "must list at least one request path",
    }


@pytest.mark.parametrize(
    "path", ["v1/models", "/v1/models?x=1", "/v1/../admin", "/has space", "/a#b", "/a\\b"]
)
def test_endpoint_refuses_bad_request_paths(path):
    endpoint = _endpoint(paths=["/ok", path])
    assert _refusal(endpoint, EndpointContract)["path"].startswith("$.paths[")


@pytest.mark.parametrize("socket", ["../engine.sock", "/tmp/engine.sock", "a/b", "..", ""])
def test_endpoint_socket_must_be_a_file_name(socket):
    assert _refusal(_endpoint(socket=socket), EndpointContract)["path"] == "$.socket"


def test_tcp_endpoint_requires_a_port():
    assert _refusal(_endpoint(transport="tcp"), EndpointContract) == {
        "path": "$.port",
        "message": 'is required when transport is "tcp"',
    }


@pytest.mark.parametrize("port", [0, 65536])
def test_tcp_endpoint_refuses_a_port_out_of_range(port):
    error = _refusal(_endpoint(transport="tcp", port=port), EndpointContract)
    assert error["path"] == "$.port"


def test_unix_endpoint_refuses_a_port():
    assert _refusal(_endpoint(port=8080), EndpointContract)["path"] == "$.port"


def test_tcp_named_constructor():
    endpoint = EndpointContract.tcp(11434, ["/api/chat"])
    assert (endpoint.transport, endpoint.port, endpoint.paths) == ("tcp", 11434, ("/api/chat",))


def test_endpoint_refuses_an_unknown_version():
    assert _refusal(_endpoint(version=2), EndpointContract) == {
        "path": "$.version",
        "message": "must be 1, got 2",
    }


def test_endpoint_refuses_an_unknown_transport():
    error = _refusal(_endpoint(transport="http"), EndpointContract)
    assert error == {"path": "$.transport", "message": 'expected one of "unix", "tcp", got "http"'}


def test_readiness_defaults():
    probe = ReadinessProbe()
    assert (probe.path, probe.timeout, probe.interval) == ("/health", 600.0, 0.5)


@pytest.mark.parametrize("field", ["timeout", "interval"])
def test_readiness_times_must_be_positive(field):
    assert _refusal({field: 0}, ReadinessProbe)["path"] == f"$.{field}"


def test_readiness_interval_must_not_exceed_the_timeout():
    assert _refusal({"timeout": 1, "interval": 2}, ReadinessProbe) == {
        "path": "$.interval",
        "message": "must not exceed the timeout (1 s), got 2",
    }


def test_readiness_path_must_start_with_a_slash():
    assert _refusal({"path": "health"}, ReadinessProbe)["path"] == "$.path"


@pytest.mark.parametrize("path", ["relative/m.gguf", "/", "/a/../b", "/a//b", "/a/./b", "/a\x00"])
def test_input_path_must_be_a_clean_absolute_path(path):
    assert _refusal({"id": "model", "path": path}, JobInput)["path"] == "$.path"


def test_input_refuses_a_malformed_digest():
    error = _refusal({"id": "model", "path": "/m", "digest": "sha256:xyz"}, JobInput)
    assert error["path"] == "$.digest"


def test_input_refuses_a_bad_id():
    assert _refusal({"id": "../model", "path": "/m"}, JobInput)["path"] == "$.id"


def test_job_defaults():
    job = structure(JOB, Job)
    assert (job.env, job.inputs, job.readiness, job.capabilities) == (
        {},
        (),
        ReadinessProbe(),
        (),
    )


def test_job_refuses_empty_argv():
    assert _refusal({**JOB, "argv": []}) == {
        "path": "$.argv",
        "message": "must list at least one argument, the executable",
    }


def test_job_refuses_an_empty_executable():
    assert _refusal({**JOB, "argv": ["", "--flag"]})["path"] == "$.argv[0]"


def test_job_refuses_nul_in_an_argument():
    assert _refusal({**JOB, "argv": ["llama-server", "a\x00b"]})["path"] == "$.argv[1]"


@pytest.mark.parametrize("name", ["1ABC", "A-B", "", "A B", "A=B"])
def test_job_refuses_bad_environment_names(name):
    assert _refusal({**JOB, "env": {name: "x"}})["path"] == f"$.env[{name!r}]"


def test_job_accepts_environment_names():
    env = {"_X": "", "LLAMA_ARG_CTX_SIZE": "2048", "lower_ok9": "v"}
    assert structure({**JOB, "env": env}, Job).env == env


def test_job_refuses_duplicate_input_ids():
    inputs = [{"id": "model", "path": "/a"}, {"id": "model", "path": "/b"}]
    assert _refusal({**JOB, "inputs": inputs})["path"] == "$.inputs[1].id"


def test_job_capabilities_are_sorted_and_deduplicated():
    job = structure({**JOB, "capabilities": ["tools", "chat", "streaming", "chat"]}, Job)
    assert job.capabilities == ("chat", "streaming", "tools")
    assert unstructure(job)["capabilities"] == ["chat", "streaming", "tools"]


def test_job_built_in_python_accepts_a_set_of_capabilities():
    job = Job(argv=["e"], endpoint=EndpointContract.unix(["/"]), capabilities={"b", "a"})
    assert job.capabilities == ("a", "b")


def test_job_refuses_a_capability_that_is_not_a_lowercase_name():
    assert _refusal({**JOB, "capabilities": ["Chat"]})["path"] == "$.capabilities[0]"


def test_job_built_in_python_refuses_a_string_as_argv():
    with pytest.raises(TypeError, match="expected a list or tuple"):
        Job(argv="llama-server", endpoint=EndpointContract.unix(["/"]))


def test_job_copies_its_environment():
    env = {"A": "1"}
    job = Job(argv=["e"], endpoint=EndpointContract.unix(["/"]), env=env)
    env["A"] = "2"
    assert job.env == {"A": "1"}


def test_job_is_hashable_despite_its_environment():
    job = structure({**JOB, "env": {"A": "1"}}, Job)
    assert hash(job) == hash(attrs.evolve(job))


def test_job_digest_changes_with_its_argv():
    job = structure(JOB, Job)
    assert job.digest() != attrs.evolve(job, argv=["llama-server", "-c", "4096"]).digest()


def test_fence_refuses_generation_zero():
    document = {"attempt_id": "a", "generation": 0, "plan_digest": D1}
    assert _refusal(document, Fence)["path"] == "$.generation"


def test_fence_refuses_a_malformed_plan_digest():
    document = {"attempt_id": "a", "generation": 1, "plan_digest": "1" * 64}
    assert _refusal(document, Fence)["path"] == "$.plan_digest"


# -- bootstrap requests ------------------------------------------------------------------

BLOB = "/api/blobs/sha256:" + "1" * 64
INPUT = {"id": "model", "path": "/models/m.gguf", "digest": D1}
BOOTSTRAPPED = {
    "argv": ["ollama", "serve"],
    "endpoint": {"paths": [BLOB, "/api/create", "/v1/chat/completions"]},
    "inputs": [INPUT],
    "bootstrap": [
        {"path": BLOB, "input_id": "model", "expect": [201]},
        {"path": "/api/create", "body": {"model": "m", "files": {"m.gguf": D1}}},
    ],
}


def test_a_job_without_bootstrap_keeps_its_canonical_json_and_digest():
    job = structure(JOB, Job)
    assert job.bootstrap is None
    assert canonical_json(job) == (
        b'{"argv":["llama-server"],"capabilities":[],"endpoint":{"paths":'
        b'["/v1/chat/completions"],"socket":"engine.sock","transport":"unix","version":1},'
        b'"env":{},"inputs":[],"readiness":{"interval":0.5,"path":"/health","timeout":600.0}}'
    )
    assert job.digest() == "sha256:8e9a7fd60fc270c302df36413b055a61a623902e4c471f2aa4fa971c301f6334"


def test_an_empty_bootstrap_is_the_same_as_none():
    job = structure({**JOB, "bootstrap": []}, Job)
    assert job.bootstrap is None
    assert job.digest() == structure(JOB, Job).digest()


def test_bootstrap_requests_keep_their_order_and_round_trip():
    job = structure(BOOTSTRAPPED, Job)
    assert [request.path for request in job.bootstrap] == [BLOB, "/api/create"]
    assert job.bootstrap[0] == BootstrapRequest(path=BLOB, input_id="model", expect=(201,))
    assert job.bootstrap[1].method == "POST" and job.bootstrap[1].expect == (200,)
    assert structure(unstructure(job), Job) == job


def test_bootstrap_changes_the_job_digest():
    job = structure(BOOTSTRAPPED, Job)
    assert job.digest() != attrs.evolve(job, bootstrap=job.bootstrap[:1]).digest()


def test_bootstrap_path_must_be_admitted_by_the_endpoint_contract():
    document = {**BOOTSTRAPPED, "bootstrap": [{"path": "/api/pull", "body": {}}]}
    assert _refusal(document)["path"] == "$.bootstrap[0].path"


def test_bootstrap_input_must_be_one_of_the_jobs_inputs():
    document = {**BOOTSTRAPPED, "bootstrap": [{"path": BLOB, "input_id": "other"}]}
    assert _refusal(document)["path"] == "$.bootstrap[0].input_id"


def test_bootstrap_input_and_body_are_exclusive():
    error = _refusal({"path": BLOB, "input_id": "model", "body": {}}, BootstrapRequest)
    assert error["path"] == "$.input_id"


def test_bootstrap_input_is_uploaded_with_post_only():
    error = _refusal({"path": BLOB, "input_id": "model", "method": "GET"}, BootstrapRequest)
    assert error["path"] == "$.input_id"


def test_bootstrap_refuses_other_methods():
    assert _refusal({"path": BLOB, "method": "DELETE"}, BootstrapRequest)["path"] == "$.method"


def test_bootstrap_expects_success_statuses_only():
    assert _refusal({"path": BLOB, "expect": [404]}, BootstrapRequest)["path"] == "$.expect[0]"
    assert _refusal({"path": BLOB, "expect": []}, BootstrapRequest)["path"] == "$.expect"


def test_bootstrap_body_is_a_bounded_json_object_or_array():
    assert _refusal({"path": BLOB, "body": "text"}, BootstrapRequest)["path"] == "$.body"
    huge = {"x": "y" * (70 * 1024)}
    assert _refusal({"path": BLOB, "body": huge}, BootstrapRequest)["path"] == "$.body"


def test_bootstrap_path_is_a_plain_request_path():
    assert _refusal({"path": "/api/create?x=1"}, BootstrapRequest)["path"] == "$.path"
