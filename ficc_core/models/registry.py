"""The model registry: project-scoped immutable manifests over shared, verified blobs.

Each file of a model fills its own private partial; only verified content is
shared (see :mod:`ficc_core.models.blobs`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import trio

from ..auth.secrets import new_id
from ..errors import Conflict, FiccError, InvalidRequest, NotFound
from ..schema import ModelManifest, canonical_json, structure
from ..store import Store, Transaction
from .acquire import RUNNING, Acquirer
from .blob_records import FAILED, VERIFIED, VERIFYING, BlobStatus, FileRef
from .blobs import BlobStore

log = logging.getLogger("ficc.models.registry")

#: Largest decoded chunk of ``POST /models/{id}/files/{index}`` ({offset, data}).
MAX_JSON_CHUNK = 1 << 20
#: Largest body of ``POST /models/{id}/files/{index}/bytes``.
MAX_BYTES_CHUNK = 16 << 20
#: Byte uploads admitted at once per project.
MAX_ACTIVE_UPLOADS = 2


class TooManyUploads(FiccError):
    """More byte uploads than a project may run at once."""

    status = 429
    code = "too_many_uploads"


def _model_not_found(model_id: str) -> NotFound:
    return NotFound(
        f"no model {model_id!r} in this project", code="model_not_found", details={"id": model_id}
    )


def _file_state(file: dict[str, Any], acquiring: bool) -> str:
    if file["state"] in (VERIFIED, VERIFYING, FAILED):
        return file["state"]
    if acquiring and file["url"]:
        return "acquiring"
    return "paused" if file["durable_offset"] > 0 else "absent"


def _error(recorded: str | None) -> dict[str, Any] | None:
    return None if recorded is None else json.loads(recorded)


def _model_view(row: dict[str, Any], files: list[dict[str, Any]]) -> dict[str, Any]:
    manifest = json.loads(row["manifest"])
    acquiring = row["acquisition_state"] == RUNNING
    views = []
    for file in files:
        state = _file_state(file, acquiring)
        error = _error(file["error"]) if state == FAILED else None
        views.append(
            {
                "index": file["idx"],
                "path": file["path"],
                "size": file["size"],
                "sha256": file["sha256"],
                "url": file["url"],
                "state": state,
                "received_bytes": file["durable_offset"],
                "verified_bytes": file["size"] if state == VERIFIED else 0,
                "reason": None if error is None else error["message"],
                "error": error,
            }
        )
    states = {view["state"] for view in views}
    if states == {VERIFIED}:
        state = VERIFIED
    elif acquiring:
        state = "acquiring"
    elif FAILED in states or row["acquisition_state"] == "failed":
        state = FAILED
    elif row["acquisition_state"] == "paused":
        state = "paused"
    else:
        state = "incomplete"
    return {
        "id": row["id"],
        "name": row["name"],
        "format": manifest["format"],
        "digest": row["digest"],
        "created_at": row["created_at"],
        "manifest": manifest,
        "state": state,
        "acquisition": None
        if row["acquisition_state"] is None
        else {
            "state": row["acquisition_state"],
            "reason": row["acquisition_reason"],
            "error": _error(row["acquisition_error"]),
        },
        "size": sum(view["size"] for view in views),
        "received_bytes": sum(view["received_bytes"] for view in views),
        "verified_bytes": sum(view["verified_bytes"] for view in views),
        "files": views,
    }


_MODEL_SELECT = (
    "SELECT m.*, a.state AS acquisition_state, a.reason AS acquisition_reason,"
    " a.error AS acquisition_error FROM models m LEFT JOIN acquisitions a ON a.model_id = m.id"
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


def _read_model(tx: Transaction, project_id: str, model_id: str) -> dict[str, Any]:
    row = tx.fetch_one(
        f"{_MODEL_SELECT} WHERE m.id = ? AND m.project_id = ?", (model_id, project_id)
    )
    if row is None:
        raise _model_not_found(model_id)
    return _model_view(row, tx.fetch_all(_FILES_SELECT, (model_id,)))


class ModelRegistry:
    """Manifests, per-file progress, uploads, acquisition control and deletion."""

    def __init__(self, store: Store, blobs: BlobStore, acquirer: Acquirer) -> None:
        self.store = store
        self.blobs = blobs
        self.acquirer = acquirer
        self._active_uploads: dict[str, int] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tidy the partials left by the previous controller, then finish their verification.

        A file whose every byte was durable when the controller stopped (during its
        verification, or just before it) is verified now, with nobody having to send
        the empty write.
        """
        complete = await self.blobs.recover()
        task_status.started()
        for ref in complete:
            async with self.blobs.lock(ref):
                try:
                    await self.blobs.verify_and_publish(ref)
                except FiccError as exc:
                    log.warning("file %s of model %s: %s", ref.index, ref.model_id, exc.message)

    async def register(
        self, project_id: str, manifest: ModelManifest
    ) -> tuple[dict[str, Any], bool]:
        """Register ``manifest``; return the model and whether it was created.

        An equal manifest under the same name is idempotent (same id back); another
        manifest under a taken name is a conflict. Files whose blobs are already
        published count as verified at once: nothing is downloaded again.
        """
        digest = manifest.digest()
        published = set()
        for file in manifest.files:
            if await self.blobs.is_published(file.sha256):
                published.add(file.sha256)

        def write(tx: Transaction) -> tuple[dict[str, Any], bool]:
            existing = tx.fetch_one(
                "SELECT id, digest FROM models WHERE project_id = ? AND name = ?",
                (project_id, manifest.name),
            )
            if existing is not None:
                if existing["digest"] == digest:
                    return _read_model(tx, project_id, existing["id"]), False
                raise Conflict(
                    f"a different model named {manifest.name!r} already exists in this project",
                    code="model_exists",
                    details={"id": existing["id"], "digest": existing["digest"]},
                )
            model_id = new_id()
            tx.execute(
                "INSERT INTO models (id, project_id, name, manifest, digest, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    model_id,
                    project_id,
                    manifest.name,
                    canonical_json(manifest).decode("utf-8"),
                    digest,
                    time.time(),
                ),
            )
            for index, file in enumerate(manifest.files):
                BlobStore.ensure_row(tx, file.sha256, file.size, published=file.sha256 in published)
                tx.execute(
                    "INSERT INTO model_files (model_id, idx, path, size, sha256, url)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (model_id, index, file.path, file.size, file.sha256, file.url),
                )
            return _read_model(tx, project_id, model_id), True

        return await self.store.write(write)

    async def list(self, project_id: str) -> list[dict[str, Any]]:
        """Every model of the project with its progress."""

        def read(tx: Transaction) -> list[dict[str, Any]]:
            rows = tx.fetch_all(
                f"{_MODEL_SELECT} WHERE m.project_id = ? ORDER BY m.created_at, m.name",
                (project_id,),
            )
            return [_model_view(row, tx.fetch_all(_FILES_SELECT, (row["id"],))) for row in rows]

        return await self.store.read(read)

    async def get(self, project_id: str, model_id: str) -> dict[str, Any]:
        """One model of the project; another project's is not found."""
        return await self.store.read(lambda tx: _read_model(tx, project_id, model_id))

    async def manifest(self, project_id: str, model_id: str) -> ModelManifest:
        """The immutable manifest of a model."""
        model = await self.get(project_id, model_id)
        return structure(model["manifest"], ModelManifest, what="stored manifest")

    # -- acquisition ------------------------------------------------------------

    async def acquire(self, project_id: str, model_id: str) -> dict[str, Any]:
        """Start or resume the acquisition of every unverified file with a source URL."""
        model = await self.get(project_id, model_id)
        if model["state"] == VERIFIED:
            return model
        if not any(f["url"] and f["state"] != VERIFIED for f in model["files"]):
            raise Conflict(
                "no unverified file of this model has a source URL; upload them instead",
                code="nothing_to_acquire",
            )
        await self.acquirer.start(model_id)
        return await self.get(project_id, model_id)

    async def pause(self, project_id: str, model_id: str) -> dict[str, Any]:
        """Stop the acquisition after any admitted write; keep the durable offsets."""
        model = await self.get(project_id, model_id)
        if model["acquisition"] is None or model["acquisition"]["state"] != RUNNING:
            raise Conflict(
                "this model is not being acquired",
                code="not_acquiring",
                details={"state": model["state"]},
            )
        await self.acquirer.pause(model_id)
        return await self.get(project_id, model_id)

    # -- uploads ----------------------------------------------------------------

    def upload_slot(self, project_id: str) -> _UploadSlot:
        """Admit one byte upload of the project, or raise :class:`TooManyUploads`."""
        return _UploadSlot(self._active_uploads, project_id)

    async def upload_target(self, project_id: str, model_id: str, index: int) -> FileRef:
        """The file an upload writes to; refused at once while its content is being acquired.

        Checked before a body is read (and again after), so an upload never waits for
        an acquisition or holds an upload slot meanwhile.
        """
        model = await self.get(project_id, model_id)
        if not 0 <= index < len(model["files"]):
            raise NotFound(
                f"model {model_id!r} has no file {index}; it has {len(model['files'])}",
                code="file_not_found",
                details={"index": index},
            )
        file = model["files"][index]
        acquiring = await self.store.read(
            lambda tx: tx.fetch_all(
                "SELECT DISTINCT f.model_id FROM model_files f"
                " JOIN models m ON m.id = f.model_id"
                " JOIN acquisitions a ON a.model_id = f.model_id"
                " WHERE f.sha256 = ? AND m.project_id = ? AND a.state = ?"
                " AND f.url IS NOT NULL ORDER BY f.model_id",
                (file["sha256"], project_id, RUNNING),
            )
        )
        if acquiring and file["state"] != VERIFIED:
            others = [row["model_id"] for row in acquiring]
            where = "this model" if others == [model_id] else f"model(s) {', '.join(others)}"
            raise Conflict(
                f"this file's content is being acquired by {where}; wait for the "
                "acquisition, or pause it before uploading",
                code="acquisition_running",
                details={"models": others},
            )
        return FileRef(model_id, index, file["sha256"], file["size"])

    async def upload(
        self, project_id: str, model_id: str, index: int, offset: int, data: bytes
    ) -> dict[str, Any]:
        """Write ``data`` at ``offset`` of file ``index``; verify and publish when complete."""
        ref = await self.upload_target(project_id, model_id, index)
        async with self.blobs.lock(ref):
            if not data:
                await self._empty_upload(ref, await self.blobs.status(ref), offset)
            else:
                status = await self.blobs.write(ref, offset, data)
                if status.durable_offset == status.size:
                    await self.blobs.verify_and_publish(ref)
        model = await self.get(project_id, model_id)
        return model["files"][index]

    async def _empty_upload(self, ref: FileRef, status: BlobStatus, offset: int) -> None:
        # The one empty write that means something: "verify the full-length partial
        # an interruption left behind". Every other empty write is refused.
        if status.verified:
            return
        details = {"offset": status.durable_offset, "size": status.size}
        if offset != status.size:
            raise InvalidRequest(
                "an empty upload is accepted only at the exact declared size "
                f"({status.size}), to verify a complete file; send bytes to upload",
                code="empty_upload",
                details=details,
            )
        if status.durable_offset != status.size:
            raise InvalidRequest(
                f"this file is incomplete: the server holds {status.durable_offset} of its "
                f"{status.size} bytes, so there is nothing to verify yet; send the rest "
                f"from offset {status.durable_offset}",
                code="empty_upload",
                details=details,
            )
        await self.blobs.verify_and_publish(ref)

    # -- deletion ---------------------------------------------------------------

    async def delete(self, project_id: str, model_id: str, *, evict: bool) -> dict[str, Any]:
        """Remove the model's metadata; with ``evict``, also blobs no other model uses."""
        model = await self.get(project_id, model_id)
        await self.acquirer.forget(model_id)

        def write(tx: Transaction) -> list[str]:
            referencing = _referencing_services(tx, model_id)
            if referencing:
                raise Conflict(
                    f"model {model_id!r} is used by inference service(s) {', '.join(referencing)}",
                    code="model_in_use",
                    details={"services": referencing},
                )
            shas = {
                row["sha256"]
                for row in tx.fetch_all(
                    "SELECT sha256 FROM model_files WHERE model_id = ?", (model_id,)
                )
            }
            tx.execute("DELETE FROM models WHERE id = ?", (model_id,))
            return sorted(
                sha
                for sha in shas
                if tx.fetch_one("SELECT 1 AS used FROM model_files WHERE sha256 = ?", (sha,))
                is None
            )

        orphans = await self.store.write(write)
        for file in model["files"]:
            ref = FileRef(model_id, file["index"], file["sha256"], file["size"])
            async with self.blobs.lock(ref):
                await self.blobs.discard(ref)  # private to this model: nobody else can use it
        evicted = []
        if evict:
            for sha256 in orphans:
                await self.blobs.remove(sha256)
                evicted.append(sha256)
            if evicted and model["format"] == "hf-directory":
                # Its assembled tree would keep the evicted content on disk.
                await self.blobs.remove_tree(
                    {f["path"]: (f["sha256"], f["size"]) for f in model["files"]}
                )
        return {"id": model["id"], "name": model["name"], "deleted": True, "evicted": evicted}


def _referencing_services(tx: Transaction, model_id: str) -> list[str]:
    rows = tx.fetch_all(
        "SELECT id FROM inference_services WHERE model_id = ? ORDER BY id", (model_id,)
    )
    return [row["id"] for row in rows]


class _UploadSlot:
    def __init__(self, active: dict[str, int], project_id: str) -> None:
        self._active = active
        self._project_id = project_id

    async def __aenter__(self) -> None:
        # The checkpoint comes first: a cancellation after counting would leak the slot.
        await trio.lowlevel.checkpoint()
        if self._active.get(self._project_id, 0) >= MAX_ACTIVE_UPLOADS:
            raise TooManyUploads(
                f"at most {MAX_ACTIVE_UPLOADS} byte uploads of a project run at once; "
                "retry shortly",
                headers={"Retry-After": "1"},
                details={"limit": MAX_ACTIVE_UPLOADS},
            )
        self._active[self._project_id] = self._active.get(self._project_id, 0) + 1

    async def __aexit__(self, *exc_info: object) -> None:
        self._active[self._project_id] -= 1
        if not self._active[self._project_id]:
            del self._active[self._project_id]
