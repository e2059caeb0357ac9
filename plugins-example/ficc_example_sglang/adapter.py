"""The sglang adapter: a service specification in, a job for SGLang's server out.

The job runs ``<image_executable> -m sglang.launch_server`` with flags from
SGLang's server arguments (https://docs.sglang.io/advanced_features/server_arguments.html):

=============================  =================================================
``--model-path``               the admitted model directory (the only input)
``--served-model-name``        the service alias, the name clients send
``--context-length``           the specification's context
``--max-running-requests``     the specification's concurrency
``--tp-size``                  the specification's parallelism, when given
``--mem-fraction-static``      the GPU reservation over the device's memory, when
                               the adapter knows the device's memory
``--is-embedding``             when the model is an embedding model
``--host`` / ``--port``        the attempt's own loopback (SGLang has no Unix
                               socket option, so the endpoint contract is TCP)
``--enable-metrics``           Prometheus metrics on ``/metrics``
=============================  =================================================

Like every adapter it only translates: no I/O, no processes, no clock.
"""

from __future__ import annotations

import math

from ficc_core import (
    EndpointContract,
    Job,
    JobInput,
    ModelRecord,
    Placement,
    ReadinessProbe,
    Specification,
)

__all__ = ["ENGINE_PORT", "SGLangAdapter", "TranslationError"]

#: The port SGLang listens on inside the attempt's network namespace (SGLang's default).
ENGINE_PORT = 30000
#: The attempt's loopback; each attempt has its own network namespace, so the port is free.
ENGINE_HOST = "127.0.0.1"

_COMMON_PATHS = ("/health", "/metrics", "/v1/models")


class TranslationError(ValueError):
    """The specification or model cannot be served by SGLang; the message says why."""


class SGLangAdapter:
    """Translate a service specification into a job for SGLang's ``launch_server``.

    :param device_memory_bytes: the total memory of each GPU of the node, when the
        operator knows it. With it, the job sets ``--mem-fraction-static`` to the
        share of that memory the placement reserves; without it (the registered
        factory), SGLang chooses its own fraction.
    """

    API_VERSION = 1
    name = "sglang"

    def __init__(self, *, device_memory_bytes: int | None = None) -> None:
        self.device_memory_bytes = device_memory_bytes

    def job(
        self,
        specification: Specification,
        model_record: ModelRecord,
        placement: Placement,
        immutable_input_references: tuple[JobInput, ...],
    ) -> Job:
        """Return the job that runs one replica of ``specification`` on ``placement``."""
        model = _model_input(model_record, immutable_input_references)
        embedding = model_record.metadata.embedding
        argv = [
            specification.image_executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model.path,
            "--served-model-name",
            specification.alias,
            "--context-length",
            str(specification.context),
            "--max-running-requests",
            str(specification.concurrency),
            "--host",
            ENGINE_HOST,
            "--port",
            str(ENGINE_PORT),
            "--enable-metrics",
        ]
        argv += self._gpu_flags(specification, placement)
        if embedding:
            argv.append("--is-embedding")
            paths = (*_COMMON_PATHS, "/v1/embeddings")
            capabilities: tuple[str, ...] = ("embeddings",)
        else:
            paths = (*_COMMON_PATHS, "/v1/chat/completions")
            capabilities = ("chat", "streaming")
        return Job(
            argv=argv,
            # The engine has no network: never let it try the Hugging Face Hub.
            env={"HF_HUB_OFFLINE": "1"},
            inputs=[model],
            endpoint=EndpointContract.tcp(ENGINE_PORT, paths),
            # Loading weights and capturing CUDA graphs can take minutes.
            readiness=ReadinessProbe(path="/health", timeout=1800.0, interval=1.0),
            capabilities=capabilities,
        )

    def _gpu_flags(self, specification: Specification, placement: Placement) -> list[str]:
        gpus = placement.limits.gpus
        flags: list[str] = []
        if specification.parallelism is not None:
            if gpus and specification.parallelism > len(gpus):
                raise TranslationError(
                    f"parallelism {specification.parallelism} needs as many GPUs, but the "
                    f"placement on {placement.node_id} reserves {len(gpus)}"
                )
            flags += ["--tp-size", str(specification.parallelism)]
        if gpus and self.device_memory_bytes is not None:
            flags += ["--mem-fraction-static", _fraction(gpus, self.device_memory_bytes)]
        return flags


def _model_input(model_record: ModelRecord, references: tuple[JobInput, ...]) -> JobInput:
    if model_record.manifest.format != "hf-directory":
        raise TranslationError(
            f"model {model_record.id!r} is {model_record.manifest.format!r}; the sglang "
            "adapter serves Hugging Face-format directories (hf-directory) only"
        )
    if len(references) != 1:
        raise TranslationError(
            f"the sglang adapter expects one input, the model directory; got {len(references)}"
        )
    return references[0]


def _fraction(gpus: tuple, device_memory_bytes: int) -> str:
    # Every tensor-parallel rank takes the same fraction, so the smallest reservation rules.
    reserved = min(gpu.memory_bytes for gpu in gpus)
    share = math.floor(reserved / device_memory_bytes * 100) / 100
    if not 0 < share <= 1:
        raise TranslationError(
            f"a GPU reservation of {reserved} bytes is not a usable share of "
            f"{device_memory_bytes} bytes of device memory"
        )
    return f"{share:.2f}"
