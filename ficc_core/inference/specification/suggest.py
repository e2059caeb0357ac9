"""Suggested specifications: a partial specification completed from its nodes and its model.

A preview may leave out ``runtime``, ``image_executable``, ``placements``, a
placement's ``node_id`` or its ``limits``. :func:`complete` fills each from what is
on record, and names every JSON path it filled:

- ``placements``: one replica; a placement without ``node_id`` goes on the first
  connected node (the embedded one first) that has a runtime for the engine and the
  room for the replica beside every reservation;
- ``runtime`` and ``image_executable``: the first placement's node's runtime for
  the engine (:data:`ENGINE_RUNTIMES`), as its snapshot advertises it;
- ``limits``: the replica's share of the node's free CPUs (the replicas suggested
  there share them; at most :data:`SUGGESTED_CPUS`) and :func:`memory_estimate` bytes;
- a placement's ``limits.gpus`` (inside suggested limits, or given limits without
  ``gpus``): when the node's runtime declares a default GPU memory
  (``default_gpu_memory_bytes``) and the node has GPUs, that much on the GPU with the
  most memory free.

A node whose runtime requires a GPU (``requires_gpu``) and which has none is never
suggested for a replica (submit would refuse it with ``tier_mismatch``).

The completed document is an explicit specification that submit accepts unchanged;
nothing is stored from a preview. :func:`memory_warnings` compares any
specification's memory limits with the estimate.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ...contributors.records import NodeState
from ...schema import InstalledRuntime, SchemaError, Specification
from ...schema._convert import check_range
from ..records import PlacementNode, Reservation

if TYPE_CHECKING:
    from .model_context import ModelContext

MIB = 1024**2
#: For a runtime that does not declare its engines: the runtimes (by the name a node
#: gives them) that run each engine, preferred first; an engine not listed runs on a
#: runtime of its own name.
ENGINE_RUNTIMES: Mapping[str, tuple[str, ...]] = {
    "llama_cpp": ("llama_server", "llama_cpp", "llama-server"),
    "ollama": ("ollama",),
    "vllm": ("vllm",),
}
#: What an engine holds beside the weights and the KV cache (its code, compute buffers,
#: the server), measured for llama_cpp: see docs/inference.md ("Suggested specifications").
ENGINE_OVERHEAD: Mapping[str, int] = {"llama_cpp": 64 * MIB}
#: The overhead assumed for an engine not measured.
DEFAULT_OVERHEAD = 256 * MIB
#: The most CPUs a suggested placement reserves (llama.cpp gains little past a few).
SUGGESTED_CPUS = 4


@attrs.frozen(kw_only=True)
class Suggestion:
    """A completed specification document and the JSON paths that were filled."""

    document: Any
    suggested: tuple[str, ...] = ()
    #: Warnings about what was suggested (a node without room for the next generation).
    notes: tuple[dict[str, Any], ...] = ()


def memory_estimate(
    model: ModelContext, engine: str, context: int, concurrency: int, prompt_cache: int = 0
) -> int:
    """Bytes one replica needs: weights, an f16 KV cache of ``context x concurrency``
    tokens (the engine's pool for every slot), the engine's overhead, and the host
    prompt cache it is given (the specification's ``prompt_cache_bytes``)."""
    tokens = context * concurrency
    cache = model.attention.kv_cache_bytes(tokens) if model.attention is not None else 0
    return model.size + cache + ENGINE_OVERHEAD.get(engine, DEFAULT_OVERHEAD) + prompt_cache


def memory_warnings(specification: Specification, model: ModelContext) -> list[dict[str, Any]]:
    """A ``memory_limit_low`` warning for each placement whose memory is below the estimate;
    ``model_header_unreadable`` first when the model's GGUF header cannot be read."""
    estimate = _estimate_of(specification, model)
    warnings = []
    if model.header_problem is not None:
        warnings.append(
            {
                "code": "model_header_unreadable",
                "message": f"model {specification.model_id!r} is verified (its bytes are the "
                f"ones its manifest names) but its GGUF header cannot be read "
                f"({model.header_problem}): the engine will most likely fail to load it, "
                "and its memory need is not estimated",
                "details": {"problem": model.header_problem, "path": "$.model_id"},
            }
        )
    for index, placement in enumerate(specification.placements):
        limit = placement.limits.memory_bytes
        if limit < estimate:
            path = f"$.placements[{index}].limits.memory_bytes"
            warnings.append(
                {
                    "code": "memory_limit_low",
                    "message": f"placement {index} allows {_mib(limit)} of memory, but the "
                    f"model needs about {_mib(estimate)} at context {specification.context} x "
                    f"concurrency {specification.concurrency}; the engine would be killed at "
                    "its limit",
                    "details": {"estimate_bytes": estimate, "limit_bytes": limit, "path": path},
                }
            )
    return warnings


def _estimate_of(specification: Specification, model: ModelContext) -> int:
    """The memory one engine of ``specification`` needs (:func:`memory_estimate`)."""
    return memory_estimate(
        model,
        specification.engine,
        specification.context,
        specification.concurrency,
        specification.prompt_cache_bytes or 0,
    )


def recomputed_limits(
    current: Specification, following: Specification, model: ModelContext
) -> tuple[Specification, list[dict[str, Any]]]:
    """A rollout's next specification with its memory limits moved by the estimate's change
    (a new context, concurrency or prompt cache), and what moved.

    A placement whose ``memory_bytes`` is the serving one's (the same index, else the
    last: ``--replicas`` copies it) was not set in this request: it becomes the serving
    limit plus the estimate's change, and at least the new estimate. One set to another
    value stays as given.
    """
    before, after = _estimate_of(current, model), _estimate_of(following, model)
    if before == after or not current.placements:
        return following, []
    placements = list(following.placements)
    changed: list[dict[str, Any]] = []
    for index, placement in enumerate(placements):
        serving = current.placements[min(index, len(current.placements) - 1)]
        limit = placement.limits.memory_bytes
        if limit != serving.limits.memory_bytes:
            continue  # given in this request
        memory = max(after, limit + after - before)
        if memory == limit:
            continue
        placements[index] = attrs.evolve(
            placement, limits=attrs.evolve(placement.limits, memory_bytes=memory)
        )
        changed.append(
            {
                "path": f"$.placements[{index}].limits.memory_bytes",
                "from": limit,
                "to": memory,
                "estimate_bytes": after,
            }
        )
    if not changed:
        return following, []
    return attrs.evolve(following, placements=tuple(placements)), changed


def _mib(value: int) -> str:
    return f"{value / MIB:,.0f} MiB"


def _runtime_for(node: PlacementNode, engine: str, given: Any = None) -> InstalledRuntime | None:
    """The node's runtime with the ``given`` runtime's image, else its runtime for ``engine``."""
    if node.snapshot is None:
        return None
    if isinstance(given, dict):
        same = [r for r in node.snapshot.runtimes if r.image_digest == given.get("image_digest")]
        return same[0] if same else None
    # A runtime that says which engines it serves (a runtime plugin's declaration) is
    # matched by that; one that does not (an agent TOML's) by the conventional names.
    declared = [r for r in node.snapshot.runtimes if r.engines and engine in r.engines]
    if declared:
        return declared[0]
    names = ENGINE_RUNTIMES.get(engine, (engine,))
    found = [r for r in node.snapshot.runtimes if r.name in names and not r.engines]
    found.sort(key=lambda r: names.index(r.name))
    return found[0] if found else None


def _usable(node: PlacementNode, engine: str, runtime: Any) -> bool:
    if node.state != NodeState.CONNECTED or node.snapshot is None:
        return False
    if not node.snapshot.supports_inference:
        return False
    found = _runtime_for(node, engine, runtime)
    return found is not None and not (found.requires_gpu and not node.snapshot.resources.gpus)


def _gpu_suggestion(
    node: PlacementNode, engine: str, runtime: Any, free: dict[int, int]
) -> list[dict[str, int]] | None:
    """The ``gpus`` to suggest on ``node``: its runtime's default GPU memory on the GPU
    with the most of ``free`` (taken from it); None when there is nothing to suggest."""
    found = _runtime_for(node, engine, runtime)
    if found is None or found.default_gpu_memory_bytes is None or not free:
        return None
    index = max(free, key=lambda i: (free[i], -i))
    free[index] -= found.default_gpu_memory_bytes
    return [{"index": index, "memory_bytes": found.default_gpu_memory_bytes}]


def _refuse(path: str, message: str) -> SchemaError:
    return SchemaError([{"path": path, "message": message}], what="specification")


def _integer(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def _cpus(share: float) -> float:
    """The CPUs a suggested replica reserves from its ``share`` of a node's free CPUs."""
    if share >= 1:
        return float(min(SUGGESTED_CPUS, math.floor(share)))
    if share >= 0.25:
        return math.floor(share * 4) / 4
    return 1.0  # the node has no CPU to spare: the plan says so


def complete(
    document: Any,
    model: ModelContext,
    nodes: Sequence[PlacementNode],
    existing: Iterable[Reservation],
) -> Suggestion:
    """Fill what ``document`` leaves out (see the module); a complete one comes back as is.

    :raises SchemaError: a part cannot be suggested (no connected node runs the engine),
        at the path of what to give.
    """
    if not isinstance(document, dict):
        return Suggestion(document=document)
    filled = copy.deepcopy(document)
    suggested: list[str] = []
    engine = filled.get("engine")
    # The limits are suggested from these: a bad one is refused at its own path, not as
    # the limits it left missing.
    for name in ("context", "concurrency", "prompt_cache_bytes"):
        if name in filled:
            check_range(Specification, name, filled[name], what="specification")
    context, concurrency = _integer(filled.get("context")), _integer(filled.get("concurrency"))
    if "placements" not in filled:
        filled["placements"] = [{}]
        suggested.append("$.placements")
    placements = filled["placements"]
    if not isinstance(placements, list) or not placements or not isinstance(engine, str):
        return Suggestion(document=filled, suggested=tuple(suggested))
    prompt_cache = _integer(filled.get("prompt_cache_bytes")) or 0
    estimate = None
    if context is not None and concurrency is not None:
        estimate = memory_estimate(model, engine, context, concurrency, prompt_cache)
    by_id = {node.node_id: node for node in nodes}
    ordered = sorted(nodes, key=lambda n: (not n.embedded, n.node_id))
    # Memory may turn float: a placement's limits are the document's, not yet validated.
    free: dict[str, tuple[float, float]] = {node.node_id: _free(node) for node in ordered}
    free_gpus = {node.node_id: _free_gpus(node) for node in ordered}
    for reservation in existing:
        if reservation.node_id in free:
            cpus, memory = free[reservation.node_id]
            free[reservation.node_id] = (cpus - reservation.cpus, memory - reservation.memory_bytes)
            _take_gpus(
                free_gpus[reservation.node_id],
                [{"index": index, "memory_bytes": size} for index, size in reservation.gpus],
            )
    runtime = filled.get("runtime")
    wanting: list[tuple[int, dict[str, Any]]] = []
    for index, placement in enumerate(placements):
        if not isinstance(placement, dict):
            continue
        where = f"$.placements[{index}]"
        if "node_id" not in placement:
            usable = [n for n in ordered if _usable(n, engine, runtime)]
            if not usable:
                raise _refuse(
                    f"{where}.node_id",
                    f"no connected node has a runtime for the {engine} engine; give node_id, "
                    "or install the engine's runtime on a node ('ficc plugins' lists runtimes)",
                )
            need = estimate or 0
            roomy = [n for n in usable if free[n.node_id][1] >= need and free[n.node_id][0] > 0]
            placement["node_id"] = (roomy or usable)[0].node_id
            suggested.append(f"{where}.node_id")
        node = by_id.get(placement["node_id"]) if isinstance(placement["node_id"], str) else None
        if node is None or node.snapshot is None:
            continue
        cpus, memory = free[node.node_id]
        if "limits" not in placement and estimate is not None:
            wanting.append((index, placement))
            free[node.node_id] = (cpus, memory - estimate)
        elif isinstance(limits := placement.get("limits"), dict):
            given_cpus, given_memory = limits.get("cpus"), limits.get("memory_bytes")
            if isinstance(given_cpus, int | float) and isinstance(given_memory, int | float):
                free[node.node_id] = (cpus - given_cpus, memory - given_memory)
            if "gpus" not in limits:
                gpus = _gpu_suggestion(node, engine, runtime, free_gpus[node.node_id])
                if gpus is not None:
                    limits["gpus"] = gpus
                    suggested.append(f"{where}.limits.gpus")
            elif isinstance(limits["gpus"], list):
                _take_gpus(free_gpus[node.node_id], limits["gpus"])
    # The replicas suggested on one node share its free CPUs, each at most half the
    # node's: a rollout's next generation then fits beside the serving one.
    sharing = Counter(placement["node_id"] for _, placement in wanting)
    notes: list[dict[str, Any]] = []
    for index, placement in wanting:
        node = by_id[placement["node_id"]]
        half = _total(node)[0] / 2
        share = min(free[placement["node_id"]][0] / sharing[placement["node_id"]], half)
        placement["limits"] = {"cpus": _cpus(share), "memory_bytes": estimate}
        note = _no_room(node, index, placement["limits"], sharing[node.node_id], free)
        if note is not None:
            notes.append(note)
        node = by_id[placement["node_id"]]
        gpus = _gpu_suggestion(node, engine, runtime, free_gpus[node.node_id])
        if gpus is not None:
            placement["limits"]["gpus"] = gpus
        suggested.append(f"$.placements[{index}].limits")
    first = placements[0] if placements and isinstance(placements[0], dict) else {}
    first_id = first.get("node_id")
    node = by_id.get(first_id) if isinstance(first_id, str) else None
    found = None if node is None else _runtime_for(node, engine, runtime)
    if "runtime" not in filled:
        if found is None:
            raise _refuse(
                "$.runtime",
                f"node {first.get('node_id')!r} has no runtime for the {engine} engine "
                f"(runtimes named {', '.join(ENGINE_RUNTIMES.get(engine, (engine,)))}); give "
                "runtime, or place the service on a node that has one",
            )
        filled["runtime"] = {
            "executor_provider": found.executor_provider,
            "package_digest": found.package_digest,
            "image_digest": found.image_digest,
            # What the runtime's declaration binds, else what its provider applies; a
            # managed service's network is always none.
            "isolation": found.isolation or found.executor_provider,
            "network": "none",
        }
        suggested.append("$.runtime")
    if "image_executable" not in filled:
        if found is None or found.executable is None:
            raise _refuse(
                "$.image_executable",
                "the node does not advertise its runtime's executable; give image_executable",
            )
        filled["image_executable"] = found.executable
        suggested.append("$.image_executable")
    return Suggestion(document=filled, suggested=tuple(suggested), notes=tuple(notes))


def _no_room(
    node: PlacementNode,
    index: int,
    limits: dict[str, Any],
    replicas: int,
    free: Mapping[str, tuple[float, float]],
) -> dict[str, Any] | None:
    """A ``no_room_for_next_generation`` warning when the node cannot hold a second copy
    of the suggested replicas beside them (a rollout's surge), else None."""
    # ``free``: the node's CPUs before the suggested replicas share them, its memory
    # once their estimates are taken.
    cpus, memory = free[node.node_id]
    if cpus >= limits["cpus"] * replicas * 2 and memory >= limits["memory_bytes"] * replicas:
        return None
    return {
        "code": "no_room_for_next_generation",
        "message": f"node {node.node_id} has no room for a second copy of placement {index} "
        f"({limits['cpus']:g} CPUs, {_mib(limits['memory_bytes'])}) beside it: a later "
        "rollout cannot start the next generation beside the serving one and needs "
        "--strategy rolling or recreate (capacity drops meanwhile); a node with more "
        "room, or smaller limits, avoids that",
        "details": {
            "path": f"$.placements[{index}].limits",
            "node_id": node.node_id,
            "strategies": ["rolling", "recreate"],
        },
    }


def _total(node: PlacementNode) -> tuple[float, int]:
    if node.snapshot is None:
        return 0.0, 0
    return node.snapshot.resources.cpus, node.snapshot.resources.memory_bytes


def _take_gpus(free: dict[int, int], gpus: list[Any]) -> None:
    """Take the given ``gpus`` (a placement's, as the document says) from ``free``."""
    for gpu in gpus:
        if isinstance(gpu, dict) and gpu.get("index") in free:
            size = gpu.get("memory_bytes")
            if isinstance(size, int) and not isinstance(size, bool):
                free[gpu["index"]] -= size


def _free_gpus(node: PlacementNode) -> dict[int, int]:
    if node.snapshot is None:
        return {}
    return {device.index: device.memory_bytes for device in node.snapshot.resources.gpus}


def _free(node: PlacementNode) -> tuple[float, int]:
    if node.snapshot is None:
        return 0.0, 0
    return node.snapshot.resources.cpus, node.snapshot.resources.memory_bytes
