"""What the model registry holds, as typed records, and the states it shows.

:mod:`.repository` reads them; ``ficc_core.api.views_models`` renders them. A
file's and a model's shown state are derived here, from what is stored (the
file's content and partial, the model's acquisition).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from .blob_records import FileRef


class AcquisitionState(enum.StrEnum):
    """The state of a model's acquisition, as stored."""

    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"


class FileState(enum.StrEnum):
    """What a model file shows: its content's state, or its partial's progress."""

    ABSENT = "absent"
    PAUSED = "paused"
    ACQUIRING = "acquiring"
    VERIFYING = "verifying"
    VERIFIED = "verified"
    FAILED = "failed"


class ModelState(enum.StrEnum):
    """What a model shows, from its files and its acquisition."""

    INCOMPLETE = "incomplete"
    ACQUIRING = "acquiring"
    PAUSED = "paused"
    VERIFIED = "verified"
    FAILED = "failed"


@attrs.frozen
class Acquisition:
    """A model's acquisition: its state, and why it failed (``error``: the envelope's)."""

    state: AcquisitionState
    reason: str | None = None
    error: Mapping[str, Any] | None = None


@attrs.frozen
class StoredFile:
    """A model file as stored: its declaration, and its content's (or partial's) progress."""

    index: int
    path: str
    size: int
    sha256: str
    url: str | None
    #: ``verified`` once the content is published, else the partial's (``partial`` if none).
    state: str
    durable_offset: int
    error: Mapping[str, Any] | None


@attrs.frozen
class ModelFile:
    """One file of a model with the state it shows."""

    index: int
    path: str
    size: int
    sha256: str
    url: str | None
    state: FileState
    received_bytes: int
    #: The last attempt's failure, while the file shows ``failed``.
    error: Mapping[str, Any] | None = None

    @property
    def verified_bytes(self) -> int:
        """Bytes whose content is verified: all of them, or none."""
        return self.size if self.state == FileState.VERIFIED else 0

    @property
    def reason(self) -> str | None:
        """The failure's message, while the file shows ``failed``."""
        return None if self.error is None else self.error["message"]

    def ref(self, model_id: str) -> FileRef:
        """The blob store's reference to this file of model ``model_id``."""
        return FileRef(model_id, self.index, self.sha256, self.size)

    @classmethod
    def shown(cls, stored: StoredFile, acquiring: bool) -> ModelFile:
        """The file as shown, while the model is (or is not) ``acquiring``."""
        if stored.state in (FileState.VERIFIED, FileState.VERIFYING, FileState.FAILED):
            state = FileState(stored.state)
        elif acquiring and stored.url:
            state = FileState.ACQUIRING
        else:
            state = FileState.PAUSED if stored.durable_offset > 0 else FileState.ABSENT
        return cls(
            index=stored.index,
            path=stored.path,
            size=stored.size,
            sha256=stored.sha256,
            url=stored.url,
            state=state,
            received_bytes=stored.durable_offset,
            error=stored.error if state == FileState.FAILED else None,
        )


@attrs.frozen
class Model:
    """A registered model: its immutable manifest, its files' progress and its state."""

    id: str
    name: str
    digest: str
    created_at: float
    #: The manifest as registered (canonical JSON, decoded).
    manifest: Mapping[str, Any]
    acquisition: Acquisition | None
    files: tuple[ModelFile, ...]
    state: ModelState

    @property
    def format(self) -> str:
        """The manifest's format (``gguf``, ``hf-directory``)."""
        return self.manifest["format"]

    @property
    def size(self) -> int:
        """Declared bytes of every file."""
        return sum(file.size for file in self.files)

    @property
    def received_bytes(self) -> int:
        """Durable bytes of every file."""
        return sum(file.received_bytes for file in self.files)

    @property
    def verified_bytes(self) -> int:
        """Verified bytes of every file."""
        return sum(file.verified_bytes for file in self.files)

    @classmethod
    def shown(
        cls,
        *,
        id: str,
        name: str,
        digest: str,
        created_at: float,
        manifest: Mapping[str, Any],
        acquisition: Acquisition | None,
        files: list[StoredFile],
    ) -> Model:
        """The model as shown, its files' and its own state derived from what is stored."""
        acquiring = acquisition is not None and acquisition.state == AcquisitionState.RUNNING
        shown = tuple(ModelFile.shown(file, acquiring) for file in files)
        states = {file.state for file in shown}
        if states == {FileState.VERIFIED}:
            state = ModelState.VERIFIED
        elif acquiring:
            state = ModelState.ACQUIRING
        elif FileState.FAILED in states or (
            acquisition is not None and acquisition.state == AcquisitionState.FAILED
        ):
            state = ModelState.FAILED
        elif acquisition is not None and acquisition.state == AcquisitionState.PAUSED:
            state = ModelState.PAUSED
        else:
            state = ModelState.INCOMPLETE
        return cls(
            id=id,
            name=name,
            digest=digest,
            created_at=created_at,
            manifest=manifest,
            acquisition=acquisition,
            files=shown,
            state=state,
        )


@attrs.frozen
class AcquisitionFile:
    """A file an acquisition may fetch: its reference, path, source and whether it is done."""

    ref: FileRef
    path: str
    url: str | None
    verified: bool


@attrs.frozen
class Deletion:
    """A deleted model and the blobs evicted with it."""

    id: str
    name: str
    evicted: tuple[str, ...]
