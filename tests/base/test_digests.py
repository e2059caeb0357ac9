"""Content-addressed files: hashing, durable renames and directory trees, in one place."""

from __future__ import annotations

import hashlib

import pytest

from ficc_core.base.digests import (
    InvalidDigest,
    UnsafePath,
    assemble_tree,
    file_digest,
    hex_digest,
    rename_durably,
    sha256_file,
    tree_listing,
)

A, B = "a" * 64, "b" * 64


def test_a_trees_name_depends_on_its_files_not_on_their_order_or_digest_spelling():
    one, name = tree_listing({"config.json": (A, 2), "w/model.bin": (f"sha256:{B}", 5)})
    _, same = tree_listing({"w/model.bin": (B, 5), "config.json": (f"sha256:{A}", 2)})
    _, other = tree_listing({"config.json": (A, 2), "w/model.bin": (B, 6)})
    assert one == [("config.json", A, 2), ("w/model.bin", B, 5)]
    assert name == same != other


@pytest.mark.parametrize("path", ["/etc/passwd", "../up", "a//b", "a/./b", ""])
def test_a_tree_path_that_could_leave_its_root_is_refused(path):
    with pytest.raises(UnsafePath) as refused:
        tree_listing({path: (A, 1)})
    assert refused.value.code == "unsafe_path"


def test_a_value_that_is_not_a_sha256_is_refused():
    assert hex_digest(f"sha256:{A}") == A
    for value in ("sha256:" + "A" * 64, "b" * 63, "md5:" + "a" * 64):
        with pytest.raises(InvalidDigest):
            hex_digest(value)


def test_a_prefix_and_a_whole_file_hash_as_hashlib_says(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"hello world")
    assert sha256_file(path, 5) == hashlib.sha256(b"hello").hexdigest()
    assert file_digest(path) == "sha256:" + hashlib.sha256(b"hello world").hexdigest()
    with pytest.raises(OSError):
        sha256_file(path, 12)


def test_a_durable_rename_keeps_a_present_target_only_when_asked(tmp_path):
    source, target = tmp_path / "part", tmp_path / "blob"
    target.write_bytes(b"verified")
    source.write_bytes(b"same content")
    rename_durably(source, target, unless_present=True)
    assert target.read_bytes() == b"verified" and not source.exists()
    source.write_bytes(b"new")
    rename_durably(source, target)
    assert target.read_bytes() == b"new" and not source.exists()


def test_a_tree_is_assembled_whole_from_links_to_its_blobs(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"weights")
    root = tmp_path / "trees" / "t"
    assemble_tree(root, {"w/model.bin": blob, "config.json": blob})
    assert (root / "w" / "model.bin").read_bytes() == b"weights"
    assert (root / "config.json").stat().st_nlink == 3
    assert sorted(p.name for p in (tmp_path / "trees").iterdir()) == ["t"]  # nothing aside


def test_builders_of_one_tree_at_once_end_with_it_whole(tmp_path):
    # Two replicas of one directory model starting together assembled the same tree in
    # one ".building" folder: one could delete the other's half-built links, and the
    # second rename failed (Directory not empty), failing that replica's launch.
    import threading

    blobs = {}
    for index in range(64):
        blob = tmp_path / f"blob{index}"
        blob.write_bytes(b"w%d" % index)
        blobs[f"d{index % 4}/f{index}.bin"] = blob
    root = tmp_path / "trees" / "t"
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def build() -> None:
        start.wait()
        try:
            assemble_tree(root, blobs)
        except BaseException as exc:  # the test reports every one
            failures.append(exc)

    builders = [threading.Thread(target=build) for _ in range(4)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(timeout=30)
    assert failures == []
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*.bin")) == sorted(blobs)
    assert sorted(p.name for p in (tmp_path / "trees").iterdir()) == ["t"]
