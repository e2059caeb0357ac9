"""What the blob store records and returns about one model file, and how it refuses.

States are stored as their strings (``partial``, ``verifying``, ``verified``,
``failed``); :class:`BlobState` compares equal to them.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from ..base.errors import Conflict, FiccError


class BlobState(enum.StrEnum):
    """Where one model file's content stands."""

    PARTIAL = "partial"
    VERIFYING = "verifying"
    VERIFIED = "verified"
    FAILED = "failed"


#: The states by name, as the store's callers compare them.
PARTIAL, VERIFYING, VERIFIED, FAILED = (
    BlobState.PARTIAL,
    BlobState.VERIFYING,
    BlobState.VERIFIED,
    BlobState.FAILED,
)


class DigestMismatch(FiccError):
    """The bytes of a complete file do not hash to the declared sha256."""

    status = 422
    code = "digest_mismatch"


class OffsetMismatch(Conflict):
    """A write did not start at the partial's durable offset."""

    code = "offset_mismatch"


class FileVerified(Conflict):
    """The file's content is already verified (perhaps through another model): nothing to write."""

    code = "file_verified"


@attrs.frozen
class FileRef:
    """One file of one model: the owner of a private partial, and the content it must hash to."""

    model_id: str
    index: int
    sha256: str
    size: int


@attrs.frozen
class BlobStatus:
    """What the store knows of one model file's content: verified, or its own partial."""

    sha256: str
    size: int
    state: BlobState
    durable_offset: int
    #: The failure of the last attempt, as an error envelope's ``error`` object.
    error: dict[str, Any] | None = None

    @property
    def verified(self) -> bool:
        """Whether the content is published."""
        return self.state == VERIFIED

    @property
    def reason(self) -> str | None:
        """The failure's message, if the last attempt failed."""
        return None if self.error is None else self.error["message"]


@attrs.frozen
class Partial:
    """One model file's private partial, as recorded: how much of it is durable, and why not more.

    ``durable_offset`` bytes of the partial file were fsynced before being recorded;
    ``error`` is the failure of the last attempt (an envelope's ``error`` object).
    """

    ref: FileRef
    state: BlobState
    durable_offset: int
    error: dict[str, Any] | None = None

    @property
    def status(self) -> BlobStatus:
        """The file's status while its content is not verified: this partial's."""
        return BlobStatus(
            self.ref.sha256, self.ref.size, self.state, self.durable_offset, self.error
        )


def error_record(error: FiccError) -> dict[str, Any]:
    """What a failure state stores and shows: the envelope's code, message and details."""
    return error.envelope()["error"]
