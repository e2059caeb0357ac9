"""The llama_cpp adapter: a service specification in, a ``llama-server`` job out.

The job is the real ``llama-server`` command line (llama.cpp ``tools/server``), so
it runs unchanged with a ``llama-server`` binary on a GPU node or with the
``ficc-llama-server`` runtime, which accepts exactly these flags. The translation
is pure: no I/O, no processes, the same job for the same arguments.

Flag mapping (checked against llama.cpp's ``tools/server/README.md``):

=====================  ===========================================================
``--model``            the one admitted GGUF input's path; for a split GGUF, the
                       first part's path inside the directory input that holds
                       every part under its own name
``--host``             ``{endpoint_socket}``: a path ending in ``.sock`` makes
                       llama-server listen on that Unix socket
``--ctx-size``         ``context * concurrency``: without a unified KV cache
                       llama.cpp divides the pool evenly across the slots
``--parallel``         ``concurrency`` (one slot per concurrent request)
``--threads``          ``ceil(placement cpus)``, at least 1
``--n-gpu-layers``     ``gpu_layers``; ``0`` on a placement without GPUs
``--tensor-split``     ``tensor_split``, one share per reserved GPU
``--alias``            the specification's ``alias`` (the model name clients send)
``--embedding``        when the model is an embedding model
``--cache-ram``        ``prompt_cache_bytes`` in whole MiB, rounded down (the host
                       prompt cache never outgrows what the estimate counts);
                       left out when absent (releases before the host cache
                       refuse the flag)
``--metrics``          always: Prometheus ``/metrics``
``--no-webui``         always: the engine serves the API only
=====================  ===========================================================
"""

from __future__ import annotations

import math
from typing import Any

from ficc_core import (
    EndpointContract,
    FieldError,
    Job,
    JobInput,
    ModelRecord,
    Placement,
    ReadinessProbe,
    Specification,
)

#: The argv element the executor replaces with the engine's Unix socket path.
ENDPOINT_SOCKET = "{endpoint_socket}"
#: ``--cache-ram`` counts MiB.
MIB = 1 << 20
#: The socket's name in the attempt directory; llama-server needs the ``.sock`` suffix.
SOCKET_NAME = "engine.sock"

HEALTH_PATH = "/health"
CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
#: OpenAI's text completions: llama-server's ``POST /v1/completions`` (a chat model only).
COMPLETIONS_PATH = "/v1/completions"
#: The gateway counts a chat's prompt with these before sending it (no slot, no generation).
TOKENIZE_PATHS = ("/apply-template", "/tokenize")
TOKENIZE = "tokenize.llama_cpp"
#: Admitted whatever the model serves: readiness, the model list and metrics.
COMMON_PATHS = (HEALTH_PATH, "/metrics", "/v1/models")


class LlamaCppUnsupported(FieldError):
    """The specification asks for something llama.cpp cannot do; ``field`` names what to change."""


def capabilities(model_record: ModelRecord) -> tuple[str, ...]:
    """What a llama_cpp service of ``model_record`` serves.

    A chat model serves chat with streaming (SSE) and text completions
    (``/v1/completions``, the raw prompt without the chat template); an embedding
    model is run with ``--embedding`` and serves embeddings only. Tools are not claimed: function
    calling depends on the model's chat template and on ``--jinja``, which older
    llama-server releases do not enable by default. A chat model's prompt can be
    counted before it is sent (``tokenize.llama_cpp``: ``/apply-template`` renders
    the messages, ``/tokenize`` counts them), so the gateway refuses one that
    cannot fit the context without taking a slot.
    """
    if model_record.metadata.embedding:
        return ("embeddings",)
    return ("chat", "streaming", "completions", TOKENIZE)


def _format_share(share: float) -> str:
    # 3.0 -> "3", 0.25 -> "0.25": the shortest exact form, so equal specs give equal argv.
    return str(int(share)) if share.is_integer() else repr(share)


def _model_input(model_record: ModelRecord, references: Any) -> tuple[JobInput, str]:
    """The model's input and the path ``--model`` names: the GGUF file, or the first part
    of a split GGUF inside its directory input (llama.cpp opens the others beside it)."""
    references = tuple(references)
    if model_record.manifest.format != "gguf":
        raise LlamaCppUnsupported(
            "model_id",
            f"llama.cpp loads GGUF models; model {model_record.id!r} is "
            f"{model_record.manifest.format!r}",
        )
    if len(references) != 1 or not isinstance(references[0], JobInput):
        raise LlamaCppUnsupported(
            "immutable_input_references",
            f"a GGUF model needs exactly one input, got {len(references)}",
        )
    [reference] = references
    weights = model_record.manifest.weights
    if len(weights) > 1:
        if reference.digest is not None:
            raise LlamaCppUnsupported(
                "immutable_input_references",
                f"a split GGUF of {len(weights)} parts needs a directory input holding "
                f"them under their names, but input {reference.id!r} is one file",
            )
        return reference, f"{reference.path.rstrip('/')}/{weights[0].path}"
    expected = "sha256:" + weights[0].sha256
    if reference.digest is not None and reference.digest != expected:
        raise LlamaCppUnsupported(
            "immutable_input_references",
            f"input {reference.id!r} has digest {reference.digest}, but the model's "
            f"{weights[0].path} is {expected}",
        )
    return reference, reference.path


def _gpu_flags(specification: Specification, placement: Placement) -> list[str]:
    gpus = len(placement.limits.gpus)
    if gpus == 0:
        if specification.gpu_layers:
            raise LlamaCppUnsupported(
                "gpu_layers",
                f"offloads {specification.gpu_layers} layers, but the placement on "
                f"{placement.node_id!r} reserves no GPU",
            )
        if specification.tensor_split is not None:
            raise LlamaCppUnsupported(
                "tensor_split", f"the placement on {placement.node_id!r} reserves no GPU"
            )
        # Explicit, so a GPU build of llama-server never offloads to an unreserved GPU.
        return ["--n-gpu-layers", "0"]
    flags = []
    if specification.gpu_layers is not None:
        flags += ["--n-gpu-layers", str(specification.gpu_layers)]
    if specification.tensor_split is not None:
        if len(specification.tensor_split) > gpus:
            raise LlamaCppUnsupported(
                "tensor_split",
                f"lists {len(specification.tensor_split)} shares, but the placement on "
                f"{placement.node_id!r} reserves {gpus} GPU(s)",
            )
        shares = ",".join(_format_share(share) for share in specification.tensor_split)
        flags += ["--tensor-split", shares]
    return flags


class LlamaCppAdapter:
    """Translate a service specification into a job for llama.cpp's ``llama-server``."""

    API_VERSION = 1
    name = "llama_cpp"

    def capabilities(self, model_record: ModelRecord) -> tuple[str, ...]:
        """What a service of ``model_record`` gets from this engine (see :func:`capabilities`)."""
        return capabilities(model_record)

    def job(
        self,
        specification: Specification,
        model_record: ModelRecord,
        placement: Placement,
        immutable_input_references: tuple[JobInput, ...],
    ) -> Job:
        """Return the job that runs one replica of ``specification`` on ``placement``.

        :raises LlamaCppUnsupported: the model is not one GGUF file input (or, split,
            one directory input), or the
            specification asks for GPUs or tensor parallelism the placement or
            llama.cpp cannot give.
        """
        model, model_path = _model_input(model_record, immutable_input_references)
        if specification.parallelism not in (None, 1):
            raise LlamaCppUnsupported(
                "parallelism",
                f"llama.cpp has no tensor-parallel degree (got {specification.parallelism}); "
                "use tensor_split to spread layers across GPUs",
            )
        served = capabilities(model_record)
        embedding = "embeddings" in served
        threads = max(1, math.ceil(placement.limits.cpus))
        argv = [
            specification.image_executable,
            "--model", model_path,
            "--host", ENDPOINT_SOCKET,
            "--ctx-size", str(specification.context * specification.concurrency),
            "--parallel", str(specification.concurrency),
            "--threads", str(threads),
            *_gpu_flags(specification, placement),
            "--alias", specification.alias,
        ]  # fmt: skip
        if embedding:
            argv.append("--embedding")
        if specification.prompt_cache_bytes is not None:
            argv += ["--cache-ram", str(specification.prompt_cache_bytes // MIB)]
        argv += ["--metrics", "--no-webui"]
        paths = [*COMMON_PATHS]
        if "chat" in served:
            paths += [CHAT_PATH, *TOKENIZE_PATHS]
        if "completions" in served:
            paths.append(COMPLETIONS_PATH)
        if embedding:
            paths.append(EMBEDDINGS_PATH)
        return Job(
            argv=argv,
            inputs=(model,),
            endpoint=EndpointContract.unix(paths, socket=SOCKET_NAME),
            readiness=ReadinessProbe(path=HEALTH_PATH),
            capabilities=served,
        )
