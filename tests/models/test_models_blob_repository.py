"""The blob store's rows in the models repository: records read back whole, states as enums."""

from __future__ import annotations

import pytest

from ficc_core.models import repository
from ficc_core.models.blob_records import BlobState, BlobStatus, FileRef, Partial
from ficc_core.schema import ModelManifest, structure

from ..support.models_support import gguf_manifest


@pytest.fixture
def config(backend_config):
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_config


async def _two_models_of_one_content(service) -> tuple[FileRef, FileRef]:
    row = await service.store.read(lambda tx: tx.fetch_one("SELECT id FROM projects"))
    refs = []
    for name in ("a", "b"):
        manifest = structure(gguf_manifest(name, b"0123456789"), ModelManifest, what="manifest")
        model, _created = await service.models.register(row["id"], manifest)
        file = manifest.files[0]
        refs.append(FileRef(model.id, 0, file.sha256, file.size))
    return refs[0], refs[1]


async def test_partials_read_back_as_recorded_and_only_while_their_model_file_exists(
    service, bootstrap
):
    mine, theirs = await _two_models_of_one_content(service)
    failed = Partial(mine, BlobState.FAILED, 4, {"code": "c", "message": "m", "details": {}})
    verifying = Partial(theirs, BlobState.VERIFYING, 10)
    gone = Partial(FileRef(mine.model_id, 7, mine.sha256, 10), BlobState.PARTIAL, 3)

    def write(tx) -> list[bool]:
        return [repository.record_partial(tx, p, now=1.0) for p in (failed, verifying, gone)]

    assert await service.store.write(write) == [True, True, False]

    def read(tx):
        return (
            repository.find_blob(tx, mine.sha256),
            repository.file_status(tx, mine),
            repository.file_status(tx, theirs),
            repository.file_status(tx, gone.ref),
            sorted(repository.list_partials(tx), key=lambda pair: pair[0].ref.model_id),
            sorted(repository.partials_of(tx, mine.sha256), key=lambda ref: ref.model_id),
        )

    blob, status, other, unrecorded, partials, holders = await service.store.read(read)
    assert blob == BlobStatus(mine.sha256, 10, BlobState.PARTIAL, 0)
    assert type(blob.state) is BlobState
    assert status == BlobStatus(mine.sha256, 10, BlobState.FAILED, 4, failed.error)
    assert type(status.state) is BlobState
    assert status.reason == "m"
    assert other == verifying.status
    # Its content is recorded, its partial is not: nothing of it is durable yet.
    assert unrecorded == BlobStatus(mine.sha256, 10, BlobState.PARTIAL, 0)
    expected = sorted([(failed, False), (verifying, False)], key=lambda p: p[0].ref.model_id)
    assert partials == expected
    assert holders == sorted([mine, theirs], key=lambda ref: ref.model_id)


async def test_verified_content_hides_partials_and_deleted_rows_are_gone(service, bootstrap):
    mine, theirs = await _two_models_of_one_content(service)

    def fill_then_verify(tx) -> None:
        repository.record_partial(tx, Partial(mine, BlobState.PARTIAL, 6), now=1.0)
        repository.record_partial(tx, Partial(theirs, BlobState.PARTIAL, 2), now=1.0)
        repository.mark_blob_verified(tx, mine.sha256, now=2.0)
        repository.delete_partial(tx, mine)

    await service.store.write(fill_then_verify)

    def read(tx):
        return (
            repository.find_blob(tx, mine.sha256),
            repository.file_status(tx, theirs),
            repository.list_partials(tx),
            repository.partials_of(tx, mine.sha256),
        )

    blob, status, partials, holders = await service.store.read(read)
    assert blob == BlobStatus(mine.sha256, 10, BlobState.VERIFIED, 10)
    assert status == BlobStatus(mine.sha256, 10, BlobState.VERIFIED, 10)
    assert partials == [(Partial(theirs, BlobState.PARTIAL, 2), True)]
    assert holders == [theirs]

    def forget(tx) -> None:
        repository.delete_partial(tx, theirs)
        repository.delete_blob(tx, mine.sha256)

    await service.store.write(forget)
    assert await service.store.read(lambda tx: repository.find_blob(tx, mine.sha256)) is None
    assert await service.store.read(lambda tx: repository.file_status(tx, mine)) is None
    assert await service.store.read(repository.list_partials) == []


async def test_a_blob_inserted_reads_back_whole(service, bootstrap):
    published = BlobStatus("ab" * 32, 5, BlobState.VERIFIED, 5)
    await service.store.write(lambda tx: repository.insert_blob(tx, published, now=3.0))
    found = await service.store.read(lambda tx: repository.find_blob(tx, published.sha256))
    assert found == published
