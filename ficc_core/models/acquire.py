"""Resumable HTTPS acquisition of a model's files into the blob store.

One task per model runs while its acquisition is ``running``; a limiter bounds
how many files download at once. Each file resumes from its partial's durable
offset with a ``Range`` request (a server that ignores ``Range`` has the bytes we
already hold skipped, not rewritten), never writes past the declared size, and is
published only when the sha256 of what was written matches; the body is received,
hashed and written in a worker thread (:mod:`~ficc_core.models.download`, over
:mod:`~ficc_core.models.fetch`'s checked connections). Transient faults (a dropped
connection, a body cut short of its ``Content-Length``, a timeout) retry with capped
backoff from the durable offset, at most ``retries`` times; a file whose every attempt
failed fails with the last fault, which says how many attempts there were. A full disk
fails the file at once with ``insufficient_storage`` and the offset it resumes from
(:mod:`~ficc_core.models.space`). Anything
else marks the acquisition failed with the reason. Pausing cancels the network read
but never an admitted write: the write completes, its offset is kept, and
``acquire`` later resumes from it. Acquisitions that were running when
the controller stopped resume when it starts.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import trio

from ..base.errors import FiccError
from ..store import Store
from ..store.outage import Backoff, OutageLog, is_store_failure
from . import repository
from .blob_records import DigestMismatch, FileRef, FileVerified, error_record
from .blobs import BlobStore
from .download import receive_into_blob
from .fetch import Fetcher, FetchError, FetchPolicy, Response, make_client, open_response
from .records import AcquisitionFile, AcquisitionState
from .space import InsufficientStorage

log = logging.getLogger("ficc.models.acquire")

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
#: Faults a retry from the durable offset may get past (``body_truncated``: the server
#: closed the connection before the end of the body its Content-Length declared).
_TRANSIENT_CODES = frozenset(
    {"fetch_timeout", "fetch_failed", "connection_dropped", "body_truncated", "server_busy"}
)


class AcquisitionFailed(FiccError):
    """A file cannot be acquired; the reason is permanent (retrying will not help)."""

    status = 502
    code = "acquisition_failed"


class _Transient(FiccError):
    code = "connection_dropped"


def _failure(failures: list[tuple[AcquisitionFile, FiccError]]) -> tuple[str, dict[str, Any]]:
    """The acquisition's reason and error from its failed files (the first one's code)."""
    failures = sorted(failures, key=lambda failure: failure[0].ref.index)
    files = [
        {"index": file.ref.index, "path": file.path, **error_record(exc)} for file, exc in failures
    ]
    reason = "; ".join(f"{file['path']}: {file['message']}" for file in files)
    first = files[0]
    return reason, {
        "code": first["code"],
        "message": reason,
        "details": {
            **first["details"],
            "index": first["index"],
            "path": first["path"],
            "files": files,
        },
    }


def _gave_up(exc: FiccError, attempts: int) -> FiccError:
    """The last transient failure of a file whose every attempt failed: the same code,
    its message and details saying how many attempts there were."""
    if attempts < 2:
        return exc
    return FiccError(
        f"{exc.message}; gave up after {attempts} attempts",
        code=exc.code,
        status=exc.status,
        details={**exc.details, "attempts": attempts},
    )


class Acquirer:
    """Runs acquisitions in its own nursery; start it with ``await nursery.start(acquirer.run)``."""

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        policy: FetchPolicy,
        *,
        concurrency: int = 2,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.clock = clock
        self.blobs = blobs
        self.policy = policy
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._limiter = trio.CapacityLimiter(concurrency)
        self._nursery: trio.Nursery | None = None
        self._client: Fetcher | None = None
        self._tasks: dict[str, trio.CancelScope] = {}
        self._finished: dict[str, trio.Event] = {}
        #: Store failures met by acquisitions (one warning per outage).
        self.outage = OutageLog("model acquisitions", logger=log)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the acquisition tasks; resume those left running by a previous controller."""
        async with make_client(self.policy) as client, trio.open_nursery() as nursery:
            self._client, self._nursery = client, nursery
            for model_id in await self.store.read(repository.running_acquisitions):
                log.info("resuming the acquisition of model %s", model_id)
                self._spawn(model_id)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def running(self, model_id: str) -> bool:
        """Whether an acquisition task for ``model_id`` is alive."""
        return model_id in self._tasks

    async def start(self, model_id: str) -> None:
        """Mark the acquisition running and start its task (no-op if already running)."""
        if self._nursery is None:
            raise FiccError("the acquirer is not running", code="acquirer_stopped", status=503)
        await self._record(model_id, AcquisitionState.RUNNING)
        if model_id not in self._tasks:
            self._spawn(model_id)

    async def pause(self, model_id: str) -> None:
        """Stop the acquisition after any admitted write completes; keep its offsets."""
        await self._record(model_id, AcquisitionState.PAUSED)
        await self._stop_task(model_id)

    async def _record(
        self,
        model_id: str,
        state: AcquisitionState,
        reason: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Record the acquisition state of a model (``error``: the failure's code and details)."""
        now = self.clock()
        await self.store.write(
            lambda tx: repository.set_acquisition(
                tx, model_id, state, reason=reason, error=error, now=now
            )
        )

    async def forget(self, model_id: str) -> None:
        """Stop the acquisition task (before its model is deleted)."""
        await self._stop_task(model_id)

    async def _stop_task(self, model_id: str) -> None:
        scope = self._tasks.get(model_id)
        if scope is not None:
            scope.cancel()
            await self._finished[model_id].wait()

    async def wait(self, model_id: str) -> None:
        """Wait until the acquisition task of ``model_id`` (if any) has ended."""
        event = self._finished.get(model_id)
        if event is not None:
            await event.wait()

    def _spawn(self, model_id: str) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._tasks[model_id] = scope
        self._finished[model_id] = trio.Event()
        self._nursery.start_soon(self._acquire_model, model_id, scope)

    async def _acquire_model(self, model_id: str, scope: trio.CancelScope) -> None:
        backoff = Backoff()
        try:
            with scope:
                while True:
                    try:
                        await self._acquire_files(model_id)
                        break
                    except Exception as exc:
                        if not is_store_failure(exc):
                            raise
                        # The store is down: what is durable stays, and the acquisition
                        # (still running on record) resumes from it once it answers.
                        self.outage.failed(exc, f"acquiring model {model_id}")
                        await backoff.wait()
                if backoff.delay:
                    self.outage.answered()
        finally:
            self._tasks.pop(model_id, None)
            self._finished.pop(model_id).set()

    async def _acquire_files(self, model_id: str) -> None:
        files = await self.store.read(lambda tx: repository.acquisition_files(tx, model_id))
        failures: list[tuple[AcquisitionFile, FiccError]] = []

        async def one(file: AcquisitionFile) -> None:
            try:
                async with self._limiter:
                    await self._acquire_file(file)
            except FiccError as exc:
                if is_store_failure(exc):
                    raise  # not the file's failure: the whole acquisition waits
                failures.append((file, exc))

        async with trio.open_nursery() as nursery:
            for file in files:
                if not file.verified and file.url:
                    nursery.start_soon(one, file)
        with trio.CancelScope(shield=True):
            if failures:
                reason, error = _failure(failures)
                await self._record(model_id, AcquisitionState.FAILED, reason, error)
            else:
                await self._record(model_id, AcquisitionState.DONE)

    async def _acquire_file(self, file: AcquisitionFile) -> None:
        url, ref = file.url, file.ref
        assert url is not None
        delay = self.backoff
        # What a failed attempt hashed and made durable, so that a retry resumes the hash too.
        hashed: dict[int, Any] = {}
        for attempt in range(self.retries + 1):
            try:
                async with self.blobs.lock(ref):
                    await self._fetch_into_blob(ref, url, hashed)
                return
            except FileVerified:
                return  # The same content was verified through another model meanwhile.
            except DigestMismatch:
                raise  # The file already records it, with its code and details.
            except InsufficientStorage as exc:
                # A full disk: what is durable stays, nothing past it, and the file
                # records the offset to resume from once space is freed.
                with trio.CancelScope(shield=True):
                    await self.blobs.cut_back(ref)
                    await self.blobs.mark_failed(ref, exc)
                raise
            except (FetchError, _Transient) as exc:
                if exc.code not in _TRANSIENT_CODES or attempt == self.retries:
                    failure = _gave_up(exc, attempt + 1) if exc.code in _TRANSIENT_CODES else exc
                    with trio.CancelScope(shield=True):
                        await self.blobs.mark_failed(
                            ref, failure, discard=exc.code == "longer_than_declared"
                        )
                    raise AcquisitionFailed(
                        failure.message, code=failure.code, details=failure.details
                    ) from None
                log.info("acquiring %s: %s; retrying in %.1fs", ref.sha256[:12], exc.message, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    async def _fetch_into_blob(self, ref: FileRef, url: str, hashed: dict[int, Any]) -> None:
        status = await self.blobs.status(ref)
        if status.verified:
            return
        if status.durable_offset == status.size:
            # A full-length partial left by an interruption: verify before asking for more.
            await self.blobs.verify_and_publish(ref)
            return
        offset = status.durable_offset
        # The body is hashed as it arrives; a resumed one starts from its prefix's hash.
        digest = hashed.pop(offset, None)
        hashed.clear()
        if digest is None:
            digest = await self.blobs.partial_digest(ref, offset)
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        assert self._client is not None
        try:
            async with open_response(self._client, url, self.policy, headers=headers) as response:
                skip = self._check_response(response, offset, status.size)
                received = await receive_into_blob(response, self.blobs, ref, offset, skip, digest)
        except FetchError as exc:
            if exc.code in _TRANSIENT_CODES:
                # Every byte written (and hashed) is durable: a retry resumes the hash.
                hashed[(await self.blobs.status(ref)).durable_offset] = digest
            raise
        if received != status.size:
            hashed[received] = digest
            raise _Transient(f"the body ended at byte {received} of {status.size}")
        await self.blobs.verify_and_publish(ref, digest=digest.hexdigest())

    @staticmethod
    def _check_response(response: Response, offset: int, size: int) -> int:
        """Return how many leading body bytes to skip; refuse unusable responses."""
        if response.status_code == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != offset:
                raise FetchError(
                    f"the server answered a range from byte {offset} with "
                    f"{response.headers.get('Content-Range')!r}",
                    code="bad_range",
                )
            return 0
        if response.status_code == 200:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > size:
                raise FetchError(
                    f"the server's body is {declared} bytes, longer than the declared size {size}",
                    code="longer_than_declared",
                )
            return offset  # Range ignored: skip what we already hold.
        if response.status_code in (429, 502, 503, 504):
            raise FetchError(f"the server answered {response.status_code}", code="server_busy")
        raise FetchError(
            f"the server answered {response.status_code} {response.reason_phrase}",
            code="http_error",
            details={"status": response.status_code},
        )
