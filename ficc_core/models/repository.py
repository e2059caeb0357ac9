"""Every SQL statement of the models package: the registry, acquisitions and blob store.

Plain functions over a :class:`~ficc_core.store.Transaction`, taking and returning
the records of :mod:`.records` and :mod:`.blob_records`. The blob store
(:mod:`.blobs`) keeps its rows here (``blobs``: whether content is verified;
``partials``: each model file's private progress); a model's view reads them
joined to its files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..schema import ModelManifest, canonical_json
from ..store import Transaction
from .blob_records import PARTIAL, VERIFIED, BlobState, BlobStatus, FileRef, Partial
from .records import (
    Acquisition,
    AcquisitionFile,
    AcquisitionState,
    Model,
    StoredFile,
)


def _decoded(recorded: str | None) -> dict[str, Any] | None:
    return None if recorded is None else json.loads(recorded)


_MODEL_SELECT = (
    "SELECT m.id, m.name, m.manifest, m.digest, m.created_at, a.state AS acquisition_state,"
    " a.reason AS acquisition_reason, a.error AS acquisition_error"
    " FROM models m LEFT JOIN acquisitions a ON a.model_id = m.id"
)
# Verified content is shared; anything else is this model's own partial (none yet: absent).
_FILES_SELECT = (
    "SELECT f.idx, f.path, f.size, f.sha256, f.url,"
    " CASE WHEN b.state = 'verified' THEN 'verified' ELSE COALESCE(p.state, 'partial') END"
    " AS state,"
    " CASE WHEN b.state = 'verified' THEN f.size ELSE COALESCE(p.durable_offset, 0) END"
    " AS durable_offset,"
    " CASE WHEN b.state = 'verified' THEN NULL ELSE p.error END AS error"
    " FROM model_files f JOIN blobs b ON b.sha256 = f.sha256"
    " LEFT JOIN partials p ON p.model_id = f.model_id AND p.idx = f.idx"
    " WHERE f.model_id = ? ORDER BY f.idx"
)


def _model(tx: Transaction, row: dict[str, Any]) -> Model:
    files = [
        StoredFile(
            index=file["idx"],
            path=file["path"],
            size=file["size"],
            sha256=file["sha256"],
            url=file["url"],
            state=file["state"],
            durable_offset=file["durable_offset"],
            error=_decoded(file["error"]),
        )
        for file in tx.fetch_all(_FILES_SELECT, (row["id"],))
    ]
    acquisition = (
        None
        if row["acquisition_state"] is None
        else Acquisition(
            state=AcquisitionState(row["acquisition_state"]),
            reason=row["acquisition_reason"],
            error=_decoded(row["acquisition_error"]),
        )
    )
    return Model.shown(
        id=row["id"],
        name=row["name"],
        digest=row["digest"],
        created_at=row["created_at"],
        manifest=json.loads(row["manifest"]),
        acquisition=acquisition,
        files=files,
    )


def find_model(tx: Transaction, project_id: str, model_id: str) -> Model | None:
    """One model of the project, with its files' progress."""
    row = tx.fetch_one(
        f"{_MODEL_SELECT} WHERE m.id = ? AND m.project_id = ?", (model_id, project_id)
    )
    return None if row is None else _model(tx, row)


def list_models(tx: Transaction, project_id: str) -> list[Model]:
    """Every model of the project, oldest first."""
    rows = tx.fetch_all(
        f"{_MODEL_SELECT} WHERE m.project_id = ? ORDER BY m.created_at, m.name", (project_id,)
    )
    return [_model(tx, row) for row in rows]


def is_model_id(tx: Transaction, project_id: str, model_id: str) -> bool:
    """Whether the project has a model with the ID ``model_id``."""
    row = tx.fetch_one(
        "SELECT 1 AS found FROM models WHERE project_id = ? AND id = ?", (project_id, model_id)
    )
    return row is not None


def find_by_name(tx: Transaction, project_id: str, name: str) -> tuple[str, str] | None:
    """``(id, digest)`` of the project's model named ``name``, if any."""
    row = tx.fetch_one(
        "SELECT id, digest FROM models WHERE project_id = ? AND name = ?", (project_id, name)
    )
    return None if row is None else (row["id"], row["digest"])


def insert_model(
    tx: Transaction,
    model_id: str,
    project_id: str,
    manifest: ModelManifest,
    *,
    digest: str,
    created_at: float,
) -> None:
    """Store a new model: its canonical manifest and one row per declared file."""
    tx.execute(
        "INSERT INTO models (id, project_id, name, manifest, digest, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            model_id,
            project_id,
            manifest.name,
            canonical_json(manifest).decode("utf-8"),
            digest,
            created_at,
        ),
    )
    for index, file in enumerate(manifest.files):
        tx.execute(
            "INSERT INTO model_files (model_id, idx, path, size, sha256, url)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (model_id, index, file.path, file.size, file.sha256, file.url),
        )


def models_acquiring_content(tx: Transaction, project_id: str, sha256: str) -> list[str]:
    """The project's models whose running acquisition fetches content ``sha256``."""
    rows = tx.fetch_all(
        "SELECT DISTINCT f.model_id FROM model_files f"
        " JOIN models m ON m.id = f.model_id"
        " JOIN acquisitions a ON a.model_id = f.model_id"
        " WHERE f.sha256 = ? AND m.project_id = ? AND a.state = ?"
        " AND f.url IS NOT NULL ORDER BY f.model_id",
        (sha256, project_id, AcquisitionState.RUNNING.value),
    )
    return [row["model_id"] for row in rows]


def services_using(tx: Transaction, model_id: str) -> list[str]:
    """The inference services that run the model (it cannot be deleted while they do)."""
    rows = tx.fetch_all(
        "SELECT id FROM inference_services WHERE model_id = ? ORDER BY id", (model_id,)
    )
    return [row["id"] for row in rows]


def delete_model(tx: Transaction, model_id: str) -> list[str]:
    """Delete a model and its files' rows; return the content no other model declares."""
    shas = {
        row["sha256"]
        for row in tx.fetch_all("SELECT sha256 FROM model_files WHERE model_id = ?", (model_id,))
    }
    tx.execute("DELETE FROM models WHERE id = ?", (model_id,))
    return sorted(
        sha
        for sha in shas
        if tx.fetch_one("SELECT 1 AS used FROM model_files WHERE sha256 = ?", (sha,)) is None
    )


# -- acquisitions --------------------------------------------------------------------------


def set_acquisition(
    tx: Transaction,
    model_id: str,
    state: AcquisitionState,
    *,
    reason: str | None,
    error: Mapping[str, Any] | None,
    now: float,
) -> None:
    """Record the state of a model's acquisition (``error``: the failure's envelope)."""
    tx.execute(
        "INSERT INTO acquisitions (model_id, state, reason, error, updated_at)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (model_id) DO UPDATE SET state = excluded.state,"
        " reason = excluded.reason, error = excluded.error, updated_at = excluded.updated_at",
        (model_id, state.value, reason, None if error is None else json.dumps(error), now),
    )


def running_acquisitions(tx: Transaction) -> list[str]:
    """The models whose acquisition is running (to resume on start)."""
    rows = tx.fetch_all(
        "SELECT model_id FROM acquisitions WHERE state = ?", (AcquisitionState.RUNNING.value,)
    )
    return [row["model_id"] for row in rows]


def acquisition_files(tx: Transaction, model_id: str) -> list[AcquisitionFile]:
    """Every file of the model with its source and whether its content is verified."""
    rows = tx.fetch_all(
        "SELECT f.idx, f.path, f.url, b.sha256, b.size, b.state"
        " FROM model_files f JOIN blobs b ON b.sha256 = f.sha256"
        " WHERE f.model_id = ? ORDER BY f.idx",
        (model_id,),
    )
    return [
        AcquisitionFile(
            ref=FileRef(model_id, row["idx"], row["sha256"], row["size"]),
            path=row["path"],
            url=row["url"],
            verified=row["state"] == VERIFIED,
        )
        for row in rows
    ]


# -- the blob store: content rows and private partials --------------------------------------


def find_blob(tx: Transaction, sha256: str) -> BlobStatus | None:
    """What is recorded of content ``sha256``: its size, and whether it is verified."""
    row = tx.fetch_one(
        "SELECT sha256, size, state, durable_offset FROM blobs WHERE sha256 = ?", (sha256,)
    )
    if row is None:
        return None
    return BlobStatus(row["sha256"], row["size"], BlobState(row["state"]), row["durable_offset"])


def insert_blob(tx: Transaction, blob: BlobStatus, *, now: float) -> None:
    """Record content a manifest declares (``blob.error`` is not stored)."""
    tx.execute(
        "INSERT INTO blobs (sha256, size, state, durable_offset, updated_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (blob.sha256, blob.size, blob.state.value, blob.durable_offset, now),
    )


def mark_blob_verified(tx: Transaction, sha256: str, *, now: float) -> None:
    """Record content ``sha256`` as verified (published)."""
    tx.execute(
        "UPDATE blobs SET state = ?, durable_offset = size, reason = NULL,"
        " updated_at = ? WHERE sha256 = ?",
        (VERIFIED.value, now, sha256),
    )


def delete_blob(tx: Transaction, sha256: str) -> None:
    """Forget content ``sha256`` (nothing references it any more)."""
    tx.execute("DELETE FROM blobs WHERE sha256 = ?", (sha256,))


def file_status(tx: Transaction, ref: FileRef) -> BlobStatus | None:
    """The file's status: its verified content, else its own partial's (none: empty).

    ``None`` when its content is not recorded at all.
    """
    row = tx.fetch_one(
        "SELECT b.state AS blob_state, p.state, p.durable_offset, p.error FROM blobs b"
        " LEFT JOIN partials p ON p.model_id = ? AND p.idx = ? WHERE b.sha256 = ?",
        (ref.model_id, ref.index, ref.sha256),
    )
    if row is None:
        return None
    if row["blob_state"] == VERIFIED:
        return BlobStatus(ref.sha256, ref.size, VERIFIED, ref.size)
    if row["state"] is None:
        return BlobStatus(ref.sha256, ref.size, PARTIAL, 0)
    return Partial(
        ref, BlobState(row["state"]), row["durable_offset"], _decoded(row["error"])
    ).status


def record_partial(tx: Transaction, partial: Partial, *, now: float) -> bool:
    """Record a model file's partial; ``False`` (nothing written) if the model file is gone."""
    ref = partial.ref
    return bool(
        tx.execute(
            "INSERT INTO partials (model_id, idx, sha256, size, state, durable_offset,"
            " error, updated_at) SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS"
            " (SELECT 1 FROM model_files WHERE model_id = ? AND idx = ?)"
            " ON CONFLICT (model_id, idx) DO UPDATE SET state = excluded.state,"
            " durable_offset = excluded.durable_offset, error = excluded.error,"
            " updated_at = excluded.updated_at",
            (
                ref.model_id,
                ref.index,
                ref.sha256,
                ref.size,
                partial.state.value,
                partial.durable_offset,
                None if partial.error is None else json.dumps(partial.error),
                now,
                ref.model_id,
                ref.index,
            ),
        )
    )


def delete_partial(tx: Transaction, ref: FileRef) -> None:
    """Forget the file's partial row."""
    tx.execute("DELETE FROM partials WHERE model_id = ? AND idx = ?", (ref.model_id, ref.index))


def partials_of(tx: Transaction, sha256: str) -> list[FileRef]:
    """The model files that hold a partial of content ``sha256``."""
    rows = tx.fetch_all(
        "SELECT model_id, idx, sha256, size FROM partials WHERE sha256 = ?", (sha256,)
    )
    return [FileRef(row["model_id"], row["idx"], row["sha256"], row["size"]) for row in rows]


def partial_updates(tx: Transaction) -> dict[tuple[str, int], float]:
    """When each partial's row was last written, by model ID and file index."""
    rows = tx.fetch_all("SELECT model_id, idx, updated_at FROM partials")
    return {(row["model_id"], row["idx"]): row["updated_at"] for row in rows}


def list_partials(tx: Transaction) -> list[tuple[Partial, bool]]:
    """Every partial, each with whether its content is verified meanwhile (another model's)."""
    rows = tx.fetch_all(
        "SELECT p.model_id, p.idx, p.sha256, p.size, p.state, p.durable_offset, p.error,"
        " b.state AS blob_state FROM partials p JOIN blobs b ON b.sha256 = p.sha256"
    )
    return [
        (
            Partial(
                FileRef(row["model_id"], row["idx"], row["sha256"], row["size"]),
                BlobState(row["state"]),
                row["durable_offset"],
                _decoded(row["error"]),
            ),
            row["blob_state"] == VERIFIED,
        )
        for row in rows
    ]
