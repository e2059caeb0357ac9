"""Placement: does each replica fit on its node beside every existing reservation?

Pure functions over plain data: the manager reads nodes and reservations inside
the same write transaction that records the result, so two concurrent submits
are serialised by the store and can never over-commit a device.

For every replica the checks are, in order: the node is known and connected and
advertises ``endpoint_version: 1``; the specification's runtime is installed there
with the same provider, package digest and image digest; the requested CPUs,
memory, GPU devices and their memory fit beside the node's reservations (and the
earlier replicas of the same plan); the model's files are there or can be staged
there (enough free disk). Each failing check is one reason: a stable ``code`` and a
sentence an operator can act on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ...contributors.records import NodeState
from ...schema import Specification, digest
from ..records import PlacementNode, Reservation

GIB = 1024**3
_EPSILON = 1e-9


def _size(value: float) -> str:
    """Bytes as an operator reads them: ``10 GiB``, ``512 MiB``, ``1.5 GiB``."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= scale:
            shown = value / scale
            return f"{shown:.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{int(value)} bytes"


def _cpus(value: float) -> str:
    return f"{value:g} CPU" + ("" if value == 1 else "s")


@attrs.frozen(kw_only=True)
class Reason:
    """Why a replica does not fit: a stable code and an actionable sentence."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@attrs.frozen(kw_only=True)
class ReplicaPlan:
    """One replica's outcome: its reservation and, when it does not fit, every reason."""

    index: int
    node_id: str
    reservation: Reservation
    reasons: tuple[Reason, ...] = ()
    #: Its reservation is taken when the plan is recorded; a scaled service's candidate
    #: placements that do not run now are planned (shown, with their fit) but not held.
    held: bool = True

    @property
    def fits(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "node_id": self.node_id,
            "held": self.held,
            "fits": self.fits,
            "reservation": self.reservation.to_json(),
            "reasons": [reason.to_json() for reason in self.reasons],
        }


@attrs.frozen(kw_only=True)
class Plan:
    """The placement of every replica of a specification, and the digest that names it."""

    replicas: tuple[ReplicaPlan, ...]
    nodes: tuple[dict[str, Any], ...]
    digest: str

    @property
    def fits(self) -> bool:
        """Every held replica fits (a planned one that does not is shown, not refused)."""
        return all(replica.fits for replica in self.replicas if replica.held)

    @property
    def reservations(self) -> tuple[Reservation, ...]:
        """The reservations the plan takes: its held replicas'."""
        return tuple(replica.reservation for replica in self.replicas if replica.held)

    def reasons(self) -> list[dict[str, Any]]:
        """Every refusal of a held replica (for the error details of a refused submit)."""
        return [
            {"index": r.index, "node_id": r.node_id, **reason.to_json()}
            for r in self.replicas
            if r.held
            for reason in r.reasons
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "plan_digest": self.digest,
            "replicas": [replica.to_json() for replica in self.replicas],
            "nodes": list(self.nodes),
        }


@attrs.define
class _Used:
    cpus: float = 0.0
    memory: int = 0
    disk: int = 0
    gpus: dict[int, int] = attrs.Factory(dict)

    def add(self, reservation: Reservation) -> None:
        self.cpus += reservation.cpus
        self.memory += reservation.memory_bytes
        self.disk += reservation.disk_bytes
        for index, size in reservation.gpus:
            self.gpus[index] = self.gpus.get(index, 0) + size


def _node_reasons(
    node: PlacementNode | None, node_id: str, specification: Specification
) -> list[Reason]:
    if node is None:
        return [
            Reason(
                code="node_not_found",
                message=f"no contributor node {node_id!r} is registered; add it with "
                "'ficc admin add-node' or place the replica elsewhere",
            )
        ]
    if node.state != NodeState.CONNECTED:
        return [
            Reason(
                code="node_unavailable",
                message=f"node {node_id} is {node.state}; it takes no new work until its "
                "executor connects",
            )
        ]
    snapshot = node.snapshot
    if snapshot is None or not snapshot.supports_inference:
        found = None if snapshot is None else snapshot.endpoint_version
        return [
            Reason(
                code="endpoint_version_unsupported",
                message=f"node {node_id}'s executors advertise endpoint_version {found}, not 1; "
                "upgrade its executors to place inference services there",
            )
        ]
    runtime = specification.runtime
    reasons = []
    providers = {info.name: info.package_digest for info in snapshot.providers}
    if runtime.executor_provider not in providers:
        reasons.append(
            Reason(
                code="provider_not_loaded",
                message=f"node {node_id} has no {runtime.executor_provider!r} executor provider "
                f"(it loads {', '.join(sorted(providers)) or 'none'})",
            )
        )
        return reasons
    installed = [
        item
        for item in snapshot.runtimes
        if item.executor_provider == runtime.executor_provider
        and item.image_digest == runtime.image_digest
    ]
    if not installed:
        known = ", ".join(
            f"{item.name} ({item.image_digest[:19]}...)"
            for item in snapshot.runtimes
            if item.executor_provider == runtime.executor_provider
        )
        reasons.append(
            Reason(
                code="runtime_not_installed",
                message=f"no runtime with image digest {runtime.image_digest} is installed for "
                f"the {runtime.executor_provider} provider on node {node_id}"
                + (f"; it has {known}" if known else "; declare it in the node's agent settings"),
            )
        )
    elif not any(item.package_digest == runtime.package_digest for item in installed):
        reasons.append(
            Reason(
                code="runtime_digest_mismatch",
                message=f"node {node_id}'s {runtime.executor_provider} provider package is "
                f"{providers[runtime.executor_provider]}, but the specification binds "
                f"{runtime.package_digest}; update the specification or the node",
            )
        )
    return reasons


def _capacity_reasons(
    node: PlacementNode, reservation: Reservation, used: _Used, model_bytes: int
) -> list[Reason]:
    assert node.snapshot is not None
    resources = node.snapshot.resources
    node_id = node.node_id
    reasons = []
    free_cpus = resources.cpus - used.cpus
    if reservation.cpus > free_cpus + _EPSILON:
        reasons.append(
            Reason(
                code="insufficient_cpu",
                message=f"node {node_id} has {_cpus(max(free_cpus, 0))} free of "
                f"{_cpus(resources.cpus)}; the replica asks {_cpus(reservation.cpus)}",
            )
        )
    free_memory = resources.memory_bytes - used.memory
    if reservation.memory_bytes > free_memory:
        reasons.append(
            Reason(
                code="insufficient_memory",
                message=f"node {node_id} has {_size(max(free_memory, 0))} of memory free; "
                f"the replica asks {_size(reservation.memory_bytes)}",
            )
        )
    devices = {device.index: device for device in resources.gpus}
    for index, size in reservation.gpus:
        device = devices.get(index)
        if device is None:
            have = ", ".join(str(i) for i in sorted(devices)) or "none"
            reasons.append(
                Reason(
                    code="gpu_not_found",
                    message=f"node {node_id} has no GPU {index} (its GPUs: {have})",
                )
            )
            continue
        free = device.memory_bytes - used.gpus.get(index, 0)
        if size > free:
            reasons.append(
                Reason(
                    code="insufficient_gpu_memory",
                    message=f"node {node_id} has {_size(max(free, 0))} free on GPU {index}; "
                    f"the replica asks {_size(size)}",
                )
            )
    if reservation.disk_bytes and reservation.disk_bytes > resources.disk_free_bytes - used.disk:
        free_disk = max(resources.disk_free_bytes - used.disk, 0)
        reasons.append(
            Reason(
                code="insufficient_disk",
                message=f"node {node_id} has {_size(free_disk)} of disk free to stage the "
                f"model's {_size(model_bytes)}; free space there or place the replica elsewhere",
            )
        )
    return reasons


def _node_summary(node_id: str, node: PlacementNode | None, before: _Used, after: _Used) -> dict:
    resources = None if node is None or node.snapshot is None else node.snapshot.resources
    gpus = []
    if resources is not None:
        for device in resources.gpus:
            gpus.append(
                {
                    "index": device.index,
                    "name": device.name,
                    "capacity": device.memory_bytes,
                    "reserved": before.gpus.get(device.index, 0),
                    "planned": after.gpus.get(device.index, 0) - before.gpus.get(device.index, 0),
                }
            )
    return {
        "node_id": node_id,
        "state": None if node is None else node.state,
        "cpus": {
            "capacity": None if resources is None else resources.cpus,
            "reserved": before.cpus,
            "planned": after.cpus - before.cpus,
        },
        "memory_bytes": {
            "capacity": None if resources is None else resources.memory_bytes,
            "reserved": before.memory,
            "planned": after.memory - before.memory,
        },
        "disk_bytes": {
            "free": None if resources is None else resources.disk_free_bytes,
            "reserved": before.disk,
            "planned": after.disk - before.disk,
        },
        "gpus": gpus,
    }


def plan(
    service_id: str,
    specification: Specification,
    nodes: Mapping[str, PlacementNode],
    existing: Iterable[Reservation],
    *,
    model_bytes: int,
    model_revision: str,
    generation: int = 0,
    held: Collection[int] | None = None,
    cumulative: bool = True,
    staged: Collection[str] = (),
) -> Plan:
    """Place every replica of ``specification`` beside the ``existing`` reservations.

    ``held`` names the replicas whose reservations the plan takes (None: every one); the
    others are planned — their fit is shown, a misfit refuses nothing. With
    ``cumulative`` (the default) each replica that fits is counted before the next is
    placed, so a preview shows whether all of them would fit together; without it each
    is placed beside ``existing`` alone (a scaled service's choice of one candidate).

    ``existing`` holds what the plan must fit beside: every other service's
    reservations, and the service's own that stay held meanwhile (a rollout's serving
    generation). The reservations are for ``generation``. A node
    that reads the controller's blob store in place (the embedded node) needs no
    disk to stage the model; any other needs ``model_bytes`` free, once per node, and
    none on the nodes named in ``staged`` (where an ``existing`` reservation of the
    same model already holds its staged copy).
    """
    used: dict[str, _Used] = {}
    for reservation in existing:
        used.setdefault(reservation.node_id, _Used()).add(reservation)
    before = {node_id: _copy(value) for node_id, value in used.items()}
    staged_here: set[str] = set(staged)
    replicas: list[ReplicaPlan] = []
    for index, placement in enumerate(specification.placements):
        node_id = placement.node_id
        node = nodes.get(node_id)
        limits = placement.limits
        # One staged copy per node serves every replica of the model there.
        stage = 0 if (node is not None and node.embedded) or node_id in staged_here else model_bytes
        reservation = Reservation(
            service_id=service_id,
            replica=index,
            node_id=node_id,
            cpus=limits.cpus,
            memory_bytes=limits.memory_bytes,
            disk_bytes=stage,
            gpus=tuple((gpu.index, gpu.memory_bytes) for gpu in limits.gpus),
            generation=generation,
        )
        reasons = _node_reasons(node, node_id, specification)
        if node is not None and node.snapshot is not None and not reasons:
            reasons += _capacity_reasons(
                node, reservation, used.setdefault(node_id, _Used()), model_bytes
            )
        if not reasons and cumulative:
            used[node_id].add(reservation)
            staged_here.add(node_id)
        replicas.append(
            ReplicaPlan(
                index=index,
                node_id=node_id,
                reservation=reservation,
                reasons=tuple(reasons),
                held=held is None or index in held,
            )
        )
    summaries = tuple(
        _node_summary(
            node_id, nodes.get(node_id), before.get(node_id, _Used()), used.get(node_id, _Used())
        )
        for node_id in dict.fromkeys(p.node_id for p in specification.placements)
    )
    plan_digest = digest(
        {
            "specification": specification.digest(),
            "model_revision": model_revision,
            "reservations": [r.reservation.to_json() for r in replicas],
        }
    )
    return Plan(replicas=tuple(replicas), nodes=summaries, digest=plan_digest)


def staged_on(existing: Iterable[Reservation], service_id: str, generation: int) -> set[str]:
    """The nodes where a reservation of ``service_id``'s ``generation`` is held: each has
    the model's staged copy already, so another replica of it there needs no disk (the
    ``staged`` of :func:`plan`)."""
    return {
        r.node_id for r in existing if r.service_id == service_id and r.generation == generation
    }


def _copy(used: _Used) -> _Used:
    return _Used(used.cpus, used.memory, used.disk, dict(used.gpus))


__all__: Sequence[str] = [
    "Plan",
    "Reason",
    "ReplicaPlan",
    "plan",
    "staged_on",
]
