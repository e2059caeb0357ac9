"""The model registry: project-scoped immutable manifests over shared, verified blobs.

Each file of a model fills its own private partial; only verified content is
shared (see :mod:`ficc_core.models.blobs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import trio

from ..auth.secrets import new_id
from ..base.errors import Conflict, FiccError, InvalidRequest, NotFound
from ..schema import ModelManifest, structure
from ..store import Store, Transaction
from ..store.outage import is_store_failure
from . import repository
from .acquire import Acquirer
from .blob_records import BlobStatus, FileRef
from .blobs import BlobStore
from .gguf import GgufMetadata, InvalidGguf, read_gguf_files
from .records import AcquisitionState, Deletion, FileState, Model, ModelFile, ModelState

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


def _require_model(tx: Transaction, project_id: str, model_id: str) -> Model:
    model = repository.find_model(tx, project_id, model_id)
    if model is None:
        raise _model_not_found(model_id)
    return model


class ModelRegistry:
    """Manifests, per-file progress, uploads, acquisition control and deletion.

    :param clock: wall-clock seconds (a model's ``created_at``).
    :param tidy_after: see :meth:`run` (the ``partial_tidy_after`` setting).
    """

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        acquirer: Acquirer,
        *,
        clock: Callable[[], float] = time.time,
        tidy_after: float = 0.0,
    ) -> None:
        self.store = store
        #: Seconds a partial must be idle before the leader's tidying touches it
        #: (0: every partial, once, when the controller starts leading).
        self.tidy_after = tidy_after
        self.blobs = blobs
        self.acquirer = acquirer
        self.clock = clock
        self._active_uploads: dict[str, int] = {}
        self._metadata: dict[str, GgufMetadata] = {}
        #: Why a verified GGUF model's header could not be read, by its digest.
        self._unreadable: dict[str, str] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The leader's tidying of partials, then the verification of complete ones.

        A file whose every byte was durable when its controller stopped (during its
        verification, or just before it) is verified here, with nobody having to send
        the empty write. With :attr:`tidy_after`, only partials idle that long are
        touched (an upload through another controller sharing the blob directory is
        never), and the tidying is repeated every half of it, so a partial skipped as
        live is tidied once idle.
        """
        complete = await self.blobs.recover(idle=self.tidy_after)
        task_status.started()
        while True:
            for ref in complete:
                async with self.blobs.lock(ref):
                    try:
                        await self.blobs.verify_and_publish(ref)
                    except FiccError as exc:
                        log.warning("file %s of model %s: %s", ref.index, ref.model_id, exc.message)
            if not self.tidy_after:
                return
            await trio.sleep(self.tidy_after / 2)
            try:
                complete = await self.blobs.recover(idle=self.tidy_after)
            except Exception as exc:
                if not is_store_failure(exc):
                    raise
                complete = []  # the store is away: tidy at the next round

    async def register(self, project_id: str, manifest: ModelManifest) -> tuple[Model, bool]:
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
        now = self.clock()

        def write(tx: Transaction) -> tuple[Model, bool]:
            existing = repository.find_by_name(tx, project_id, manifest.name)
            if existing is not None:
                existing_id, existing_digest = existing
                if existing_digest == digest:
                    return _require_model(tx, project_id, existing_id), False
                raise Conflict(
                    f"a different model named {manifest.name!r} already exists in this project",
                    code="model_exists",
                    details={"id": existing_id, "digest": existing_digest},
                )
            # A service names its model by ID or name: one must never be the other's.
            if repository.is_model_id(tx, project_id, manifest.name):
                raise Conflict(
                    f"the name {manifest.name!r} is the ID of another model of this "
                    "project, so a service's model_id could not tell the two apart; "
                    "choose another name",
                    code="model_name_taken",
                    details={"id": manifest.name, "path": "$.name"},
                )
            model_id = new_id()
            while repository.find_by_name(tx, project_id, model_id) is not None:
                model_id = new_id()
            for file in manifest.files:
                BlobStore.ensure_row(tx, file.sha256, file.size, published=file.sha256 in published)
            repository.insert_model(
                tx, model_id, project_id, manifest, digest=digest, created_at=now
            )
            return _require_model(tx, project_id, model_id), True

        return await self.store.write(write)

    async def list(self, project_id: str) -> list[Model]:
        """Every model of the project with its progress."""
        return await self.store.read(partial(repository.list_models, project_id=project_id))

    async def get(self, project_id: str, model_id: str) -> Model:
        """One model of the project; another project's is not found."""
        return await self.store.read(lambda tx: _require_model(tx, project_id, model_id))

    async def manifest(self, project_id: str, model_id: str) -> ModelManifest:
        """The immutable manifest of a model."""
        model = await self.get(project_id, model_id)
        return structure(model.manifest, ModelManifest, what="stored manifest")

    async def metadata(self, model: Model) -> GgufMetadata | None:
        """What a verified GGUF model's headers say; None for other models.

        Read in a worker thread from the published files (every part of a split
        GGUF), once per revision: a manifest never changes.
        """
        if model.format != "gguf" or model.state != ModelState.VERIFIED:
            return None
        cached = self._metadata.get(model.digest)
        if cached is not None:
            return cached
        manifest = structure(model.manifest, ModelManifest, what="stored manifest")
        paths = [self.blobs.published_path(file.sha256) for file in manifest.weights]
        if model.digest in self._unreadable:
            return None
        try:
            metadata = await trio.to_thread.run_sync(read_gguf_files, paths)
        except InvalidGguf as exc:
            # The bytes are the ones the manifest names (verified), but no GGUF reader
            # will make sense of them: said where a service of it is planned.
            log.warning("cannot read the GGUF header of model %s: %s", model.id, exc.message)
            self._unreadable[model.digest] = exc.message
            return None
        except OSError as exc:
            log.warning("cannot read the GGUF header of model %s: %s", model.id, exc)
            return None
        self._metadata[model.digest] = metadata
        return metadata

    def header_problem(self, model: Model) -> str | None:
        """Why the verified GGUF ``model``'s header could not be read (after
        :meth:`metadata`), or None."""
        return self._unreadable.get(model.digest)

    # -- acquisition ------------------------------------------------------------

    async def acquire(self, project_id: str, model_id: str) -> Model:
        """Start or resume the acquisition of every unverified file with a source URL."""
        model = await self.get(project_id, model_id)
        if model.state == ModelState.VERIFIED:
            return model
        if not any(f.url and f.state != FileState.VERIFIED for f in model.files):
            raise Conflict(
                "no unverified file of this model has a source URL; upload them instead",
                code="nothing_to_acquire",
            )
        await self.acquirer.start(model_id)
        return await self.get(project_id, model_id)

    async def pause(self, project_id: str, model_id: str) -> Model:
        """Stop the acquisition after any admitted write; keep the durable offsets."""
        model = await self.get(project_id, model_id)
        if model.acquisition is None or model.acquisition.state != AcquisitionState.RUNNING:
            raise Conflict(
                "this model is not being acquired",
                code="not_acquiring",
                details={"state": str(model.state)},
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
        if not 0 <= index < len(model.files):
            raise NotFound(
                f"model {model_id!r} has no file {index}; it has {len(model.files)}",
                code="file_not_found",
                details={"index": index},
            )
        file = model.files[index]
        others = await self.store.read(
            partial(repository.models_acquiring_content, project_id=project_id, sha256=file.sha256)
        )
        if others and file.state != FileState.VERIFIED:
            where = "this model" if others == [model_id] else f"model(s) {', '.join(others)}"
            raise Conflict(
                f"this file's content is being acquired by {where}; wait for the "
                "acquisition, or pause it before uploading",
                code="acquisition_running",
                details={"models": others},
            )
        return file.ref(model_id)

    async def upload(
        self, project_id: str, model_id: str, index: int, offset: int, data: bytes
    ) -> ModelFile:
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
        return model.files[index]

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

    async def delete(self, project_id: str, model_id: str, *, evict: bool) -> Deletion:
        """Remove the model's metadata; with ``evict``, also blobs no other model uses."""
        model = await self.get(project_id, model_id)
        await self.acquirer.forget(model_id)

        def write(tx: Transaction) -> list[str]:
            referencing = repository.services_using(tx, model_id)
            if referencing:
                raise Conflict(
                    f"model {model_id!r} is used by inference service(s) {', '.join(referencing)}",
                    code="model_in_use",
                    details={"services": referencing},
                )
            return repository.delete_model(tx, model_id)

        # Freeing space must work on a full disk: the store's write needs room first.
        await self.blobs.make_room()
        orphans = await self.store.write(write)
        for file in model.files:
            ref = file.ref(model_id)
            async with self.blobs.lock(ref):
                await self.blobs.discard(ref)  # private to this model: nobody else can use it
        evicted = []
        if evict:
            for sha256 in orphans:
                await self.blobs.remove(sha256)
                evicted.append(sha256)
            if evicted and model.format == "hf-directory":
                # Its assembled tree would keep the evicted content on disk.
                await self.blobs.remove_tree({f.path: (f.sha256, f.size) for f in model.files})
        return Deletion(id=model.id, name=model.name, evicted=tuple(evicted))


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
