"""FICC Inference: the public plugin API.

Plugins import only the names listed in ``__all__`` from this package::

    from ficc_core import API_VERSION, Job, hookimpl

Every name is resolved on first use, so ``import ficc_core`` stays cheap: it loads
neither pluggy nor the data model until a plugin or the control plane asks for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # The plugin contract.
    "API_VERSION": "ficc_core.hookspecs",
    "hookimpl": "ficc_core.plugins",
    "Adapter": "ficc_core.plugins",
    "AdapterRegistry": "ficc_core.plugins",
    "ExecutorProvider": "ficc_core.executor",
    "ExecutorRegistry": "ficc_core.plugins",
    "RuntimeRegistry": "ficc_core.plugins",
    "PluginError": "ficc_core.base.errors",
    # What executor providers share (ficc_core.executor).
    "ExecutorAttempt": "ficc_core.executor",
    "SupervisingProvider": "ficc_core.executor",
    "attempt_key": "ficc_core.executor",
    "AttemptStatus": "ficc_core.executor",
    "AttemptState": "ficc_core.executor",
    "ResponseHead": "ficc_core.executor",
    "BodyChunk": "ficc_core.executor",
    "EndOfStream": "ficc_core.executor",
    "StreamFailed": "ficc_core.executor",
    "ReadEvent": "ficc_core.executor",
    "EndpointStreams": "ficc_core.executor",
    "BoundedLog": "ficc_core.executor",
    "check_fence": "ficc_core.executor",
    "measure_resources": "ficc_core.executor",
    "package_digest": "ficc_core.executor",
    "total_memory": "ficc_core.executor",
    "process_start_time": "ficc_core.executor",
    "CHUNK_SIZE": "ficc_core.executor",
    "QUEUE_CHUNKS": "ficc_core.executor",
    "ALLOWED_REQUEST_HEADERS": "ficc_core.executor",
    "ExecutorError": "ficc_core.executor",
    "StaleFence": "ficc_core.executor",
    "UnknownAttempt": "ficc_core.executor",
    "AttemptExists": "ficc_core.executor",
    "UnknownStream": "ficc_core.executor",
    "StreamExists": "ficc_core.executor",
    "TooManyStreams": "ficc_core.executor",
    "PathNotAdmitted": "ficc_core.executor",
    "PayloadTooLarge": "ficc_core.executor",
    "EngineUnavailable": "ficc_core.executor",
    "IsolationUnavailable": "ficc_core.executor",
    "ImageDigestMismatch": "ficc_core.executor",
    "InputNotAdmitted": "ficc_core.executor",
    "LaunchFailed": "ficc_core.executor",
    # The data model adapters and executor providers exchange with core.
    "Specification": "ficc_core.schema",
    "Capabilities": "ficc_core.schema",
    "Runtime": "ficc_core.schema",
    "Scaling": "ficc_core.schema",
    "Placement": "ficc_core.schema",
    "ResourceLimits": "ficc_core.schema",
    "GpuRequest": "ficc_core.schema",
    "ModelManifest": "ficc_core.schema",
    "ModelFile": "ficc_core.schema",
    "ModelSource": "ficc_core.schema",
    "ModelMetadata": "ficc_core.schema",
    "ModelRecord": "ficc_core.schema",
    "Workload": "ficc_core.schema",
    "EndpointContract": "ficc_core.schema",
    "ReadinessProbe": "ficc_core.schema",
    "JobInput": "ficc_core.schema",
    "BootstrapRequest": "ficc_core.schema",
    "Job": "ficc_core.schema",
    "Fence": "ficc_core.schema",
    "ExecutorSnapshot": "ficc_core.schema",
    "NodeResources": "ficc_core.schema",
    "GpuDevice": "ficc_core.schema",
    "InstalledRuntime": "ficc_core.schema",
    "ProviderInfo": "ficc_core.schema",
    # Raised by a validator to refuse one field, so the error path names it.
    "FieldError": "ficc_core.schema",
}

__all__ = [
    "ALLOWED_REQUEST_HEADERS",
    "API_VERSION",
    "CHUNK_SIZE",
    "QUEUE_CHUNKS",
    "Adapter",
    "AdapterRegistry",
    "AttemptExists",
    "AttemptState",
    "AttemptStatus",
    "BodyChunk",
    "BootstrapRequest",
    "BoundedLog",
    "Capabilities",
    "EndOfStream",
    "EndpointContract",
    "EndpointStreams",
    "EngineUnavailable",
    "ExecutorAttempt",
    "ExecutorError",
    "ExecutorProvider",
    "ExecutorRegistry",
    "ExecutorSnapshot",
    "Fence",
    "FieldError",
    "GpuDevice",
    "GpuRequest",
    "ImageDigestMismatch",
    "InputNotAdmitted",
    "InstalledRuntime",
    "IsolationUnavailable",
    "Job",
    "JobInput",
    "LaunchFailed",
    "ModelFile",
    "ModelManifest",
    "ModelMetadata",
    "ModelRecord",
    "ModelSource",
    "NodeResources",
    "PathNotAdmitted",
    "PayloadTooLarge",
    "Placement",
    "PluginError",
    "ProviderInfo",
    "ReadEvent",
    "ReadinessProbe",
    "ResourceLimits",
    "ResponseHead",
    "Runtime",
    "RuntimeRegistry",
    "Scaling",
    "Specification",
    "StaleFence",
    "StreamExists",
    "StreamFailed",
    "SupervisingProvider",
    "TooManyStreams",
    "UnknownAttempt",
    "UnknownStream",
    "Workload",
    "attempt_key",
    "check_fence",
    "hookimpl",
    "measure_resources",
    "package_digest",
    "process_start_time",
    "total_memory",
]

if TYPE_CHECKING:
    from .base.errors import PluginError
    from .executor import (
        ALLOWED_REQUEST_HEADERS,
        CHUNK_SIZE,
        QUEUE_CHUNKS,
        AttemptExists,
        AttemptState,
        AttemptStatus,
        BodyChunk,
        BoundedLog,
        EndOfStream,
        EndpointStreams,
        EngineUnavailable,
        ExecutorAttempt,
        ExecutorError,
        ExecutorProvider,
        ImageDigestMismatch,
        InputNotAdmitted,
        IsolationUnavailable,
        LaunchFailed,
        PathNotAdmitted,
        PayloadTooLarge,
        ReadEvent,
        ResponseHead,
        StaleFence,
        StreamExists,
        StreamFailed,
        SupervisingProvider,
        TooManyStreams,
        UnknownAttempt,
        UnknownStream,
        attempt_key,
        check_fence,
        measure_resources,
        package_digest,
        process_start_time,
        total_memory,
    )
    from .hookspecs import API_VERSION
    from .plugins import Adapter, AdapterRegistry, ExecutorRegistry, RuntimeRegistry, hookimpl
    from .schema import (
        BootstrapRequest,
        Capabilities,
        EndpointContract,
        ExecutorSnapshot,
        Fence,
        GpuDevice,
        GpuRequest,
        InstalledRuntime,
        Job,
        JobInput,
        ModelFile,
        ModelManifest,
        ModelMetadata,
        ModelRecord,
        ModelSource,
        NodeResources,
        Placement,
        ProviderInfo,
        ReadinessProbe,
        ResourceLimits,
        Runtime,
        Scaling,
        Specification,
        Workload,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ficc_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
