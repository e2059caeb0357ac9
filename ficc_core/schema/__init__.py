"""The data model: attrs frozen classes, one private cattrs converter, canonical JSON.

Build objects from JSON with :func:`structure` (refusals raise :class:`SchemaError`
listing each bad field by path), turn them back with :func:`unstructure`, and
compare or fence them with :func:`canonical_json` and :func:`digest`.
"""

from ._convert import FieldError, SchemaError, canonical_json, digest, structure, unstructure
from .job import BootstrapRequest, EndpointContract, Fence, Job, JobInput, ReadinessProbe
from .models import ModelFile, ModelManifest, ModelMetadata, ModelRecord, ModelSource
from .snapshot import ExecutorSnapshot, GpuDevice, InstalledRuntime, NodeResources, ProviderInfo
from .spec import (
    Capabilities,
    GpuRequest,
    Placement,
    ResourceLimits,
    Runtime,
    Scaling,
    Specification,
)
from .workload import Workload

__all__ = [
    "BootstrapRequest",
    "Capabilities",
    "EndpointContract",
    "ExecutorSnapshot",
    "Fence",
    "FieldError",
    "GpuDevice",
    "GpuRequest",
    "InstalledRuntime",
    "Job",
    "JobInput",
    "ModelFile",
    "ModelManifest",
    "ModelMetadata",
    "ModelRecord",
    "ModelSource",
    "NodeResources",
    "Placement",
    "ProviderInfo",
    "ReadinessProbe",
    "ResourceLimits",
    "Runtime",
    "Scaling",
    "SchemaError",
    "Specification",
    "Workload",
    "canonical_json",
    "digest",
    "structure",
    "unstructure",
]
