"""The adapter conformance kit passes a conforming adapter and names each rule a bad one breaks."""

from __future__ import annotations

import builtins
import io
import os
import pathlib
import socket
import subprocess
import uuid

import attrs
import pytest

import ficc_core.testing
from ficc_core import EndpointContract, Job, ReadinessProbe
from ficc_core.testing import AdapterConformanceError, check_adapter, make_case
from ficc_core.testing.adapter_kit import io_forbidden

CASES = [
    make_case("sample"),
    make_case("sample", concurrency=8, context=2048, gpu_memory_bytes=[8 * 1024**3]),
    make_case("sample", model_format="hf-directory", embedding=True),
]
PATHS = ("/health", "/v1/chat/completions", "/v1/embeddings", "/v1/models")


class SampleAdapter:
    """A conforming adapter: its job depends only on its arguments."""

    API_VERSION = 1

    def job(self, specification, model_record, placement, immutable_input_references):
        [model] = immutable_input_references
        return Job(
            argv=[
                specification.image_executable,
                "--model",
                model.path,
                "--socket",
                "{endpoint_socket}",
                "--ctx",
                str(specification.context),
                "--threads",
                str(int(placement.limits.cpus)),
            ],
            env={"ENGINE_LOG": "info"},
            inputs=[model],
            endpoint=EndpointContract.unix(PATHS),
            readiness=ReadinessProbe(path="/health"),
            capabilities=["chat", "streaming"]
            + (["embeddings"] if model_record.metadata.embedding else []),
        )


def adapter_with(job_body):
    """An adapter class whose job() runs ``job_body`` and then behaves like the sample."""

    class Adapter(SampleAdapter):
        def job(self, *args):
            replaced = job_body(self, *args)
            return replaced if replaced is not None else super().job(*args)

    return Adapter


def test_the_kit_is_public_in_ficc_core_testing():
    assert ficc_core.testing.check_adapter is check_adapter
    assert "check_adapter" in ficc_core.testing.__all__


def test_a_conforming_adapter_passes_and_gets_its_jobs_back():
    jobs = check_adapter(SampleAdapter, cases=CASES)
    assert [job.argv[2] for job in jobs] == [case.inputs[0].path for case in CASES]


def test_cases_may_be_plain_tuples():
    case = CASES[0]
    [job] = check_adapter(
        SampleAdapter,
        cases=[(case.specification, case.model_record, case.placement, case.inputs)],
    )
    assert job.inputs == case.inputs


def test_an_empty_case_list_is_refused():
    with pytest.raises(AdapterConformanceError, match="at least one case"):
        check_adapter(SampleAdapter, cases=[])


@pytest.mark.parametrize("version", [2, "1", None, True])
def test_an_adapter_that_does_not_declare_api_version_1_fails(version):
    Adapter = type("Adapter", (SampleAdapter,), {"API_VERSION": version})
    with pytest.raises(
        AdapterConformanceError, match=r"declares API_VERSION .*supports API_VERSION 1"
    ):
        check_adapter(Adapter, cases=CASES)


def test_an_adapter_without_api_version_fails():
    class Adapter:
        def job(self, *args):
            return SampleAdapter().job(*args)

    with pytest.raises(AdapterConformanceError, match="does not declare API_VERSION"):
        check_adapter(Adapter, cases=CASES)


def test_an_adapter_that_reads_a_file_fails_naming_the_call(tmp_path):
    config = tmp_path / "engine.cfg"
    config.write_text("threads=4")

    def read_config(self, *args):
        with open(config) as file:
            file.read()

    with pytest.raises(AdapterConformanceError, match=r"\[gguf.*\] job\(\) did I/O: open\(\)"):
        check_adapter(adapter_with(read_config), cases=CASES)


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda path: pathlib.Path(path).exists(), "pathlib.Path.exists"),
        (lambda path: pathlib.Path(path).read_bytes(), "pathlib.Path.read_bytes"),
        (lambda path: os.stat(path), "os.stat"),
        (lambda path: os.path.getsize(path), "os.path.getsize"),
        (lambda path: os.open(path, os.O_RDONLY), "os.open"),
        (lambda path: io.open(path), "io.open"),  # noqa: UP020 (the io alias is patched too)
        (lambda path: os.listdir(path), "os.listdir"),
    ],
)
def test_every_kind_of_file_access_is_blocked(call, shown):
    def touch_the_model(self, specification, model_record, placement, inputs):
        call(inputs[0].path)

    with pytest.raises(AdapterConformanceError, match=rf"did I/O: {shown}\(\)"):
        check_adapter(adapter_with(touch_the_model), cases=CASES)


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM), "socket.socket"),
        (lambda: socket.create_connection(("127.0.0.1", 9)), "socket.create_connection"),
        (lambda: socket.getaddrinfo("localhost", 80), "socket.getaddrinfo"),
    ],
)
def test_an_adapter_that_opens_a_socket_or_resolves_a_name_fails(call, shown):
    with pytest.raises(AdapterConformanceError, match=rf"did I/O: {shown}\(\)"):
        check_adapter(adapter_with(lambda self, *args: call()), cases=CASES)


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda: subprocess.run(["true"], check=True), "subprocess.run"),
        (lambda: subprocess.Popen(["true"]), "subprocess.Popen"),
        (lambda: os.system("true"), "os.system"),
        (lambda: os.fork(), "os.fork"),
        (lambda: os.execv("/bin/true", ["true"]), "os.execv"),
        (lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]), "os.spawnv"),
        (lambda: os.posix_spawn("/bin/true", ["true"], {}), "os.posix_spawn"),
    ],
)
def test_an_adapter_that_starts_a_process_fails(call, shown):
    with pytest.raises(AdapterConformanceError, match=rf"did I/O: {shown}\(\)"):
        check_adapter(adapter_with(lambda self, *args: call()), cases=CASES)


def test_an_adapter_that_swallows_the_blocked_call_still_fails():
    def sneaky(self, *args):
        try:
            socket.getaddrinfo("example.org", 443)
        except Exception:
            pass

    with pytest.raises(AdapterConformanceError, match="swallowed the error"):
        check_adapter(adapter_with(sneaky), cases=CASES)


def test_blocked_calls_are_restored_afterwards():
    def current():
        return (builtins.open, io.open, os.open, os.stat, socket.socket, subprocess.Popen)

    originals = current()
    path_open = pathlib.Path.__dict__["open"]
    with io_forbidden():
        assert builtins.open is not originals[0]
    assert current() == originals
    assert pathlib.Path.__dict__["open"] is path_open
    with pytest.raises(AdapterConformanceError):
        check_adapter(adapter_with(lambda self, *args: os.stat("/")), cases=CASES)
    assert current() == originals
    assert os.stat("/")  # usable again


def test_a_non_deterministic_adapter_fails():
    def random_port(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, env={"ENGINE_ID": uuid.uuid4().hex})

    with pytest.raises(AdapterConformanceError, match="not deterministic: a second call"):
        check_adapter(adapter_with(random_port), cases=CASES)


def test_an_adapter_whose_instances_disagree_fails():
    counter = iter(range(100))

    class Adapter(SampleAdapter):
        def __init__(self):
            self.seed = next(counter)

        def job(self, *args):
            return attrs.evolve(super().job(*args), env={"SEED": str(self.seed)})

    with pytest.raises(AdapterConformanceError, match="not deterministic: a fresh adapter"):
        check_adapter(Adapter, cases=CASES)


def test_an_adapter_that_references_an_unadmitted_path_fails():
    def extra_path(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, argv=[*job.argv, "--lora", "/home/user/adapter.bin"])

    with pytest.raises(
        AdapterConformanceError, match=r"argv\[10\] = '/home/user/adapter.bin'.*not an admitted"
    ):
        check_adapter(adapter_with(extra_path), cases=CASES)


def test_an_unadmitted_path_in_the_environment_or_a_flag_value_fails():
    def env_path(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, env={"HF_HOME": "/root/.cache/huggingface"})

    with pytest.raises(AdapterConformanceError, match=r"env\['HF_HOME'\].*not an admitted"):
        check_adapter(adapter_with(env_path), cases=CASES)

    def flag_path(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, argv=[*job.argv, "--log-file=/var/log/engine.log"])

    with pytest.raises(AdapterConformanceError, match=r"'/var/log/engine\.log'"):
        check_adapter(adapter_with(flag_path), cases=CASES)


def test_allowed_paths_and_urls_and_request_paths_are_not_inputs():
    def fixed_paths(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        extra = ["--config", "/etc/engine.toml", "--health-path", "/health"]
        return attrs.evolve(job, argv=[*job.argv, *extra], env={"PROXY": "http://127.0.0.1:9/x"})

    check_adapter(adapter_with(fixed_paths), cases=CASES, allowed_paths={"/etc/engine.toml"})


def test_an_adapter_that_uses_an_input_without_declaring_it_fails():
    def undeclared(self, specification, model_record, placement, inputs):
        return attrs.evolve(
            SampleAdapter().job(specification, model_record, placement, inputs), inputs=[]
        )

    with pytest.raises(
        AdapterConformanceError, match=r"uses admitted input 'model' but Job\.inputs"
    ):
        check_adapter(adapter_with(undeclared), cases=CASES)


def test_an_adapter_that_declares_an_input_it_was_not_given_fails():
    def invented(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        forged = attrs.evolve(inputs[0], id="weights")
        return attrs.evolve(job, inputs=[forged])

    with pytest.raises(
        AdapterConformanceError, match="'weights', which is not one of the admitted"
    ):
        check_adapter(adapter_with(invented), cases=CASES)


def test_an_adapter_that_alters_an_admitted_input_fails():
    def moved(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, inputs=[attrs.evolve(inputs[0], path="/tmp/model")])

    with pytest.raises(AdapterConformanceError, match="changes admitted input 'model'"):
        check_adapter(adapter_with(moved), cases=CASES)


def test_an_adapter_whose_readiness_path_the_contract_does_not_admit_fails():
    def unprobed(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, readiness=ReadinessProbe(path="/ready"))

    with pytest.raises(
        AdapterConformanceError, match="readiness probe's path '/ready' is not admitted"
    ):
        check_adapter(adapter_with(unprobed), cases=CASES)


def test_an_adapter_with_unknown_capabilities_fails():
    def boasts(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, capabilities=["chat", "telepathy"])

    with pytest.raises(AdapterConformanceError, match=r"unknown capabilities \['telepathy'\]"):
        check_adapter(adapter_with(boasts), cases=CASES)


def test_an_adapter_claiming_a_capability_whose_route_it_does_not_admit_fails():
    def claims(self, specification, model_record, placement, inputs):
        job = SampleAdapter().job(specification, model_record, placement, inputs)
        return attrs.evolve(job, capabilities=["chat", "completions"])

    with pytest.raises(
        AdapterConformanceError,
        match="declares 'completions' but its endpoint contract does not admit /v1/completions",
    ):
        check_adapter(adapter_with(claims), cases=CASES)


def test_an_adapter_that_returns_something_else_than_a_job_fails():
    with pytest.raises(AdapterConformanceError, match=r"must return a ficc_core\.Job, got dict"):
        check_adapter(adapter_with(lambda self, *args: {"argv": ["x"]}), cases=CASES)


def test_make_case_builds_gguf_and_hf_directory_inputs():
    gguf = make_case("x")
    directory = make_case("x", model_format="hf-directory", gpu_memory_bytes=[1, 2])
    assert gguf.inputs[0].digest is not None and gguf.model_record.manifest.format == "gguf"
    assert directory.inputs[0].digest is None
    assert directory.model_record.manifest.format == "hf-directory"
    assert [gpu.index for gpu in directory.placement.limits.gpus] == [0, 1]
    with pytest.raises(ValueError, match="model_format"):
        make_case("x", model_format="onnx")
