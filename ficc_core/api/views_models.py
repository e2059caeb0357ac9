"""The JSON views of the model registry's records: models, their files, deletions."""

from __future__ import annotations

from typing import Any

from ..models.gguf import GgufMetadata
from ..models.records import Deletion, Model, ModelFile


def model_file_view(file: ModelFile) -> dict[str, Any]:
    """One file of a model: its declaration, state and progress."""
    return {
        "index": file.index,
        "path": file.path,
        "size": file.size,
        "sha256": file.sha256,
        "url": file.url,
        "state": str(file.state),
        "received_bytes": file.received_bytes,
        "verified_bytes": file.verified_bytes,
        "reason": file.reason,
        "error": None if file.error is None else dict(file.error),
    }


def model_view(model: Model) -> dict[str, Any]:
    """A model: its manifest, state, acquisition and every file's progress."""
    acquisition = model.acquisition
    return {
        "id": model.id,
        "name": model.name,
        "format": model.format,
        "digest": model.digest,
        "created_at": model.created_at,
        "manifest": dict(model.manifest),
        "state": str(model.state),
        "acquisition": None
        if acquisition is None
        else {
            "state": str(acquisition.state),
            "reason": acquisition.reason,
            "error": None if acquisition.error is None else dict(acquisition.error),
        },
        "size": model.size,
        "received_bytes": model.received_bytes,
        "verified_bytes": model.verified_bytes,
        "files": [model_file_view(file) for file in model.files],
    }


def model_detail_view(
    model: Model, metadata: GgufMetadata | None, metadata_error: str | None = None
) -> dict[str, Any]:
    """A model as ``GET /models/{id}`` shows it: :func:`model_view` and, as an extension
    beside it, ``metadata``: what a verified GGUF model's headers say (null otherwise)."""
    return {
        **model_view(model),
        "metadata": None if metadata is None else metadata.to_json(),
        "metadata_error": metadata_error,
    }


def deletion_view(deletion: Deletion) -> dict[str, Any]:
    """A deleted model and the content evicted with it."""
    return {
        "id": deletion.id,
        "name": deletion.name,
        "deleted": True,
        "evicted": list(deletion.evicted),
    }
