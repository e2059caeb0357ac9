"""What an executor advertises about its node: providers, resources, runtimes.

The controller places replicas only where a snapshot shows the resources and the
installed runtime. ``endpoint_version`` came later: older executors leave it out,
which keeps them working for ordinary jobs but refuses them for inference.

``protocol_version`` is the node protocol version the snapshot is written in
(:data:`~ficc_core.nodelink.wire.PROTOCOL_VERSION`; absent: ``1.0``, every agent
before versions were sent). A snapshot one minor version newer than this controller
may carry optional fields it does not know: :func:`snapshot_from_wire` leaves them
out and structures the rest as strictly as ever (docs/agents.md, "Protocol versions").
"""

import re
from typing import Any

import attrs

from ..base.strictjson import INT64_MAX
from ._convert import MAX_SAFE_INTEGER, FieldError, integer, known_fields, number, structure
from .spec import (
    MAX_CPUS,
    MAX_GPU_INDEX,
    _as_dict,
    _as_tuple,
    _digest_string,
    _identifier,
    _items,
    _node_id,
    _optional,
    _shown,
    _text,
)

LABEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")

#: The endpoint contract version this controller speaks.
ENDPOINT_VERSION = 1
#: The node protocol version whose snapshot fields this controller knows (the same as
#: :data:`ficc_core.nodelink.wire.PROTOCOL_VERSION`; schema imports nothing of nodelink).
SNAPSHOT_VERSION = (1, 1)


@attrs.frozen(kw_only=True)
class ProviderInfo:
    """An executor provider loaded on the node.

    :ivar name: the provider's name (``process``, ``container``, ...).
    :ivar package_digest: ``sha256:<hex>`` of the provider's package.
    """

    name: str = attrs.field(validator=_identifier)
    package_digest: str = attrs.field(validator=_digest_string)


@attrs.frozen(kw_only=True)
class MigDevice:
    """One MIG instance of a GPU (a slice with its own memory and compute).

    :ivar gpu_instance_id: the GPU instance's ID on its device.
    :ivar compute_instance_id: the compute instance's ID within it.
    :ivar memory_bytes: the memory of the slice, in bytes.
    :ivar uuid: its ``MIG-...`` UUID where the discovery reports one.
    """

    gpu_instance_id: int = integer(0, MAX_SAFE_INTEGER)
    compute_instance_id: int = integer(0, MAX_SAFE_INTEGER)
    memory_bytes: int = integer(0, MAX_SAFE_INTEGER)
    uuid: str | None = attrs.field(default=None, validator=_optional(_text(128)))


@attrs.frozen(kw_only=True)
class GpuDevice:
    """One GPU on the node.

    :ivar index: the device index placements refer to (0 or more).
    :ivar name: the device's model name, as the driver reports it.
    :ivar memory_bytes: its total memory in bytes (0 or more).
    """

    index: int = integer(0, MAX_GPU_INDEX)
    name: str = attrs.field(validator=_text())
    memory_bytes: int = integer(0, MAX_SAFE_INTEGER)
    #: Later additions, each left out when the discovery did not say (a GPU declared by
    #: an older executor, ``nvidia-smi`` without the field): the device's UUID (what
    #: ``CUDA_VISIBLE_DEVICES`` names it by), its free memory and its utilisation (percent)
    #: when the snapshot was taken, its MIG instances when MIG is on, and the indexes of
    #: the GPUs it reaches over NVLink.
    uuid: str | None = attrs.field(default=None, validator=_optional(_text(128)))
    memory_free_bytes: int | None = integer(0, MAX_SAFE_INTEGER, default=None)
    utilization: int | None = integer(0, 100, default=None)
    mig: tuple[MigDevice, ...] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_as_tuple),
        validator=_optional(_items(MigDevice)),
    )
    nvlink_peers: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_as_tuple),
        validator=_optional(attrs.validators.deep_iterable(attrs.validators.instance_of(int))),
    )


def _distinct_devices(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _items(GpuDevice)(_instance, attribute, value)
    seen: set[int] = set()
    for position, device in enumerate(value):
        if device.index in seen:
            raise FieldError(
                f"{attribute.name}[{position}].index", f"repeats GPU index {device.index}"
            )
        seen.add(device.index)


@attrs.frozen(kw_only=True)
class NodeResources:
    """The capacity a node offers to workloads.

    :ivar cpus: CPU cores available (0 or more).
    :ivar memory_bytes: memory available, in bytes (0 or more).
    :ivar disk_free_bytes: free disk under the executor's data directory (0 or more).
    :ivar gpus: the GPUs present, each index once.
    """

    cpus: float = number(0, MAX_CPUS)
    memory_bytes: int = integer(0, MAX_SAFE_INTEGER)
    disk_free_bytes: int = integer(0, INT64_MAX)
    gpus: tuple[GpuDevice, ...] = attrs.field(
        default=(), converter=_as_tuple, validator=_distinct_devices
    )
    #: Later additions, left out when not known: where the GPUs were found (``nvml``,
    #: ``nvidia-smi``), the driver's version, and why discovery failed on a node whose
    #: driver is present but broken (such a node reports no GPUs and says so here).
    gpu_source: str | None = attrs.field(default=None, validator=_optional(_identifier))
    gpu_driver: str | None = attrs.field(default=None, validator=_optional(_text(64)))
    gpu_error: str | None = attrs.field(default=None, validator=_optional(_text(1024)))


@attrs.frozen(kw_only=True)
class InstalledRuntime:
    """A runtime image installed on the node, which a specification's runtime must match.

    :ivar name: the runtime's name (``llama_server``, ...).
    :ivar executor_provider: the provider that runs it.
    :ivar package_digest: ``sha256:<hex>`` of that provider's package.
    :ivar image_digest: ``sha256:<hex>`` of the runtime image.

    Later additions, each left out when its declaration does not say (older
    executors never send them): what a specification for this runtime needs.

    :ivar engines: the engines (adapters) it serves.
    :ivar executable: the absolute path of its engine executable (``image_executable``).
    :ivar isolation: the isolation a specification's runtime binds for it.
    :ivar network: the network a specification's runtime binds for it.
    :ivar requires_gpu: true when the runtime runs only on a node with a GPU (left out,
        like false, for a runtime that also runs on CPUs).
    :ivar default_gpu_memory_bytes: the device memory a replica usually reserves on each
        of its GPUs, which a preview suggests (left out: no suggestion).
    """

    name: str = attrs.field(validator=_identifier)
    executor_provider: str = attrs.field(validator=_identifier)
    package_digest: str = attrs.field(validator=_digest_string)
    image_digest: str = attrs.field(validator=_digest_string)
    engines: tuple[str, ...] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_as_tuple),
        validator=_optional(attrs.validators.deep_iterable(_identifier)),
    )
    executable: str | None = attrs.field(default=None, validator=_optional(_text(4096)))
    isolation: str | None = attrs.field(default=None, validator=_optional(_identifier))
    network: str | None = attrs.field(default=None, validator=_optional(_identifier))
    requires_gpu: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool))
    )
    default_gpu_memory_bytes: int | None = integer(1, MAX_SAFE_INTEGER, default=None)


def _labels(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    for name, text in value.items():
        if not isinstance(name, str) or not LABEL_NAME_PATTERN.fullmatch(name):
            raise FieldError(
                f"{attribute.name}[{name!r}]",
                'is not a label name: use up to 63 letters, digits, ".", "_", "/" or "-"',
            )
        if not isinstance(text, str) or len(text) > 256 or re.search(r"[\x00-\x1f\x7f]", text):
            raise FieldError(
                f"{attribute.name}[{name!r}]",
                f"must be a string of at most 256 characters without control characters, "
                f"got {_shown(text)}",
            )


@attrs.frozen(kw_only=True)
class ExecutorSnapshot:
    """What one executor advertises about its node.

    :ivar node_id: the node's ID.
    :ivar providers: the executor providers loaded there.
    :ivar resources: the capacity it offers.
    :ivar runtimes: the runtime images installed there.
    :ivar labels: free-form facts for operators (``zone``, ``gpu.vendor``, ...).
    :ivar endpoint_version: the endpoint contract version it implements; older
        executors leave it out (and it is left out of the canonical JSON then).
    :ivar protocol_version: the node protocol version it is written in (``1.1``); left
        out by agents before versions and by any agent talking to such a controller.
    """

    node_id: str = attrs.field(validator=_node_id)
    providers: tuple[ProviderInfo, ...] = attrs.field(
        converter=_as_tuple, validator=_items(ProviderInfo)
    )
    resources: NodeResources = attrs.field(validator=attrs.validators.instance_of(NodeResources))
    runtimes: tuple[InstalledRuntime, ...] = attrs.field(
        default=(), converter=_as_tuple, validator=_items(InstalledRuntime)
    )
    labels: dict[str, str] = attrs.field(
        factory=dict, converter=_as_dict, validator=_labels, hash=False
    )
    endpoint_version: int | None = integer(1, MAX_SAFE_INTEGER, default=None)
    protocol_version: str | None = attrs.field(default=None, validator=_optional(_text(16)))

    @property
    def supports_inference(self) -> bool:
        """Whether inference replicas may be placed here (endpoint version 1 only)."""
        return self.endpoint_version == ENDPOINT_VERSION


def snapshot_from_wire(data: Any) -> tuple[ExecutorSnapshot, list[str]]:
    """A heartbeat's snapshot, and the paths of the fields left out as a newer agent's.

    Written in a newer minor protocol version of the same major one, its unknown fields
    are left out (optional additions by definition); any other snapshot is structured
    as it is, so an unknown field there is refused as ever. Known fields are never read
    differently whatever the version says. Raises :class:`SchemaError`.

    The version belongs to the wire: the snapshot returned leaves it out, so the form
    the controller stores is one an older controller sharing the database reads too.
    """
    dropped: list[str] = []
    if isinstance(data, dict) and _newer(data.get("protocol_version")):
        data, dropped = known_fields(data, ExecutorSnapshot)
    snapshot = structure(data, ExecutorSnapshot, what="snapshot")
    return attrs.evolve(snapshot, protocol_version=None), dropped


def stored_snapshot(data: Any) -> ExecutorSnapshot:
    """A snapshot the store holds, written by this controller or by a newer one sharing
    the database during an upgrade: fields this one does not know are left out."""
    known, _ = known_fields(data, ExecutorSnapshot)
    return structure(known, ExecutorSnapshot, what="snapshot")


def _newer(version: Any) -> bool:
    if not isinstance(version, str):
        return False
    major, _, minor = version.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return False
    return int(major) == SNAPSHOT_VERSION[0] and int(minor) > SNAPSHOT_VERSION[1]
