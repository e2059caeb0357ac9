"""The ollama adapter: a service specification in, a job that runs ``ollama serve`` out.

Ollama starts empty and is given its model through its own API, so the job is
``ollama serve`` plus two ordered bootstrap requests the executor sends once the
server answers:

1. ``POST /api/blobs/sha256:<digest>`` with the admitted GGUF input as the body
   (the executor streams the file itself; no client ever picks it), and
2. ``POST /api/create`` with ``{"model": <alias>, "files": {<name>.gguf:
   "sha256:<digest>"}, "parameters": {...}, "stream": false}``.

Clients then use Ollama's OpenAI-compatible routes. References (Ollama's own docs):

- ``docs/api.md``, "Create a Model" (``files``, ``parameters``, ``stream``),
  "Check if a Blob Exists" and "Push a Blob" (201 Created, 400 on a digest
  mismatch; an existing blob answers 200 in ``server/routes.go``
  ``CreateBlobHandler``): https://github.com/ollama/ollama/blob/main/docs/api.md
- ``docs/openai.md``, OpenAI compatibility: ``/v1/chat/completions``,
  ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``: https://github.com/ollama/ollama/blob/main/docs/openai.md
- ``envconfig/config.go`` and ``docs/faq.md`` for ``OLLAMA_HOST``, ``OLLAMA_MODELS``,
  ``OLLAMA_NUM_PARALLEL``, ``OLLAMA_CONTEXT_LENGTH``, ``OLLAMA_KEEP_ALIVE`` (negative:
  keep loaded forever) and ``OLLAMA_MAX_LOADED_MODELS``.
- ``docs/modelfile.md``, "Valid Parameters and Values": ``num_ctx``, ``num_gpu``,
  ``num_thread``.
"""

from __future__ import annotations

import math
import posixpath
from typing import TYPE_CHECKING, Any

from ficc_core import BootstrapRequest, EndpointContract, FieldError, Job, ReadinessProbe

if TYPE_CHECKING:
    from ficc_core import JobInput, ModelRecord, Placement, Specification

#: Ollama's default port, on the attempt's own loopback (its private network namespace).
PORT = 11434
#: Where Ollama keeps blobs and manifests: relative, so it resolves against the engine's
#: working directory, which every provider makes the attempt's private ``work/``.
MODELS_DIRECTORY = "models"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
MODELS = "/v1/models"
VERSION = "/api/version"
CREATE = "/api/create"


class OllamaUnsupported(FieldError):
    """The specification asks for something Ollama cannot do.

    ``field`` names the specification field (or ``model_id`` / ``inputs``) and the
    message says what to change, so the API reports it like any refused field.
    """


def capabilities(model_record: ModelRecord) -> tuple[str, ...]:
    """What a service of this model gets from Ollama, from the model's metadata.

    An embedding model serves ``/v1/embeddings`` only. A generative model serves
    chat with streaming and text completions (``/v1/completions``), and tools when
    its GGUF carries a chat template (Ollama builds its prompt template, including
    tool calls, from it).
    """
    metadata = model_record.metadata
    if metadata.embedding:
        return ("embeddings",)
    found = ["chat", "streaming", "completions"]
    if metadata.chat_template:
        found.append("tools")
    return tuple(found)


def _model_input(model_record: ModelRecord, inputs: tuple[JobInput, ...]) -> JobInput:
    manifest = model_record.manifest
    if manifest.format != "gguf":
        raise OllamaUnsupported(
            "model_id",
            f"the ollama adapter serves GGUF models; model {model_record.id!r} is "
            f"{manifest.format!r} (use the vllm adapter for a Hugging Face directory)",
        )
    if len(manifest.weights) > 1:
        raise OllamaUnsupported(
            "model_id",
            f"the ollama adapter serves single-file GGUF models; model {model_record.id!r} "
            f"is a split GGUF of {len(manifest.weights)} parts (use the llama_cpp adapter)",
        )
    if len(inputs) != 1 or inputs[0].digest is None:
        raise OllamaUnsupported(
            "inputs",
            "the ollama adapter needs exactly one admitted GGUF file input with its digest, "
            f"got {len(inputs)} input(s)",
        )
    return inputs[0]


def _file_name(model_record: ModelRecord) -> str:
    # Ollama treats a "files" entry as GGUF by its ".gguf" suffix.
    name = posixpath.basename(model_record.manifest.files[0].path)
    return name if name.endswith(".gguf") else "model.gguf"


def _parameters(specification: Specification, placement: Placement) -> dict[str, Any]:
    limits = placement.limits
    parameters: dict[str, Any] = {
        "num_ctx": specification.context,
        # Threads within the CPU reservation: more would only be throttled.
        "num_thread": max(1, math.floor(limits.cpus)),
    }
    if specification.gpu_layers is not None:
        parameters["num_gpu"] = specification.gpu_layers
    elif not limits.gpus:
        parameters["num_gpu"] = 0
    return parameters


def _refuse_unsupported(specification: Specification) -> None:
    if specification.tensor_split is not None:
        raise OllamaUnsupported(
            "tensor_split",
            "Ollama spreads a model's layers across GPUs itself and has no tensor split "
            "setting; leave tensor_split out for the ollama engine",
        )
    if specification.parallelism not in (None, 1):
        raise OllamaUnsupported(
            "parallelism",
            "Ollama has no tensor parallelism; leave parallelism out (or 1) for the ollama "
            "engine and use concurrency for parallel requests",
        )
    if specification.prompt_cache_bytes is not None:
        raise OllamaUnsupported(
            "prompt_cache_bytes",
            "Ollama keeps no host prompt cache it can be given; leave prompt_cache_bytes "
            "out for the ollama engine",
        )


class OllamaAdapter:
    """Translate a service specification into a job for ``ollama serve``."""

    API_VERSION = 1
    name = "ollama"

    def job(
        self,
        specification: Specification,
        model_record: ModelRecord,
        placement: Placement,
        immutable_input_references: tuple[JobInput, ...],
    ) -> Job:
        """Return the job that runs one replica of ``specification`` on ``placement``."""
        _refuse_unsupported(specification)
        model = _model_input(model_record, tuple(immutable_input_references))
        blob = f"/api/blobs/{model.digest}"
        served = capabilities(model_record)
        paths = [VERSION, blob, CREATE, MODELS]
        paths += [EMBEDDINGS] if "embeddings" in served else [CHAT, COMPLETIONS]
        env = {
            "OLLAMA_HOST": f"127.0.0.1:{PORT}",
            "OLLAMA_MODELS": MODELS_DIRECTORY,
            # ollama serve keeps its key pair under $HOME/.ollama: the working directory.
            "HOME": ".",
            "OLLAMA_NUM_PARALLEL": str(specification.concurrency),
            "OLLAMA_CONTEXT_LENGTH": str(specification.context),
            "OLLAMA_KEEP_ALIVE": "-1",
            "OLLAMA_MAX_LOADED_MODELS": "1",
        }
        create = {
            "model": specification.alias,
            "files": {_file_name(model_record): model.digest},
            "parameters": _parameters(specification, placement),
            "stream": False,
        }
        return Job(
            argv=[specification.image_executable, "serve"],
            env=env,
            inputs=[model],
            endpoint=EndpointContract.tcp(PORT, paths),
            readiness=ReadinessProbe(path=VERSION, timeout=600.0, interval=0.5),
            capabilities=served,
            bootstrap=[
                # An existing blob answers 200, a new one 201 Created.
                BootstrapRequest(path=blob, input_id=model.id, expect=(200, 201)),
                BootstrapRequest(path=CREATE, body=create, expect=(200,)),
            ],
        )
