"""Model manifest rules: safe relative paths, digests, HTTPS sources, format layouts."""

import pytest

from ficc_core.schema import ModelFile, ModelManifest, ModelSource, SchemaError, structure

HEX = "0f" * 32
GGUF_FILE = {"path": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": HEX, "size": 98}
MANIFEST = {"files": [GGUF_FILE], "format": "gguf", "name": "SmolLM2 135M"}
HF_FILES = [
    {"path": "config.json", "sha256": HEX, "size": 700},
    {"path": "model.safetensors", "sha256": HEX, "size": 269060552},
    {"path": "tokenizer/tokenizer.json", "sha256": HEX, "size": 2104556},
]


def _refusal(document: dict, cls: type = ModelManifest) -> dict[str, str]:
    with pytest.raises(SchemaError) as caught:
        structure(document, cls)
    [error] = caught.value.errors
    return error


def _file(path: str, **changes: object) -> dict:
    return {**GGUF_FILE, "path": path, **changes}


@pytest.mark.parametrize("path", ["model.gguf", "a/b/c.json", "with space.bin", "ünï.txt"])
def test_file_accepts_relative_posix_paths(path):
    assert structure(_file(path), ModelFile).path == path


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "must be relative, not absolute"),
        ("../escape.gguf", 'must not contain "." or ".." segments'),
        ("a/../../b", 'must not contain "." or ".." segments'),
        ("./model.gguf", 'must not contain "." or ".." segments'),
        ("a//b", "must not have empty segments"),
        ("dir/", "must not have empty segments"),
        ("dir\\model.gguf", 'must use "/" between segments'),
        ("model\x00.gguf", "must not contain NUL"),
        ("", "must be a non-empty relative path"),
    ],
)
def test_file_refuses_unsafe_paths(path, reason):
    error = _refusal(_file(path), ModelFile)
    assert error["path"] == "$.path"
    assert error["message"].startswith(reason)


@pytest.mark.parametrize("sha256", ["0F" * 32, "0f" * 31, "sha256:" + "0f" * 32, "zz" * 32])
def test_file_refuses_a_malformed_sha256(sha256):
    assert _refusal(_file("m.gguf", sha256=sha256), ModelFile)["path"] == "$.sha256"


def test_file_refuses_a_negative_size():
    assert _refusal(_file("m.gguf", size=-1), ModelFile) == {
        "path": "$.size",
        "message": "must be from 0 to 9007199254740991, got -1",
    }


def test_file_accepts_an_https_url():
    url = "https://huggingface.co/x/y/resolve/main/m.gguf"
    assert structure(_file("m.gguf", url=url), ModelFile).url == url


@pytest.mark.parametrize("url", ["http://example.com/m.gguf", "ftp://x/m", "https://", "HTTPS:x"])
def test_file_refuses_a_url_that_is_not_https(url):
    error = _refusal(_file("m.gguf", url=url), ModelFile)
    assert error["path"] == "$.url"
    assert "https://" in error["message"]


def test_manifest_refuses_no_files():
    assert _refusal({**MANIFEST, "files": []}) == {
        "path": "$.files",
        "message": "must list at least one file",
    }


def test_manifest_refuses_a_duplicate_path():
    files = [GGUF_FILE, {**GGUF_FILE, "size": 1}]
    error = _refusal({**MANIFEST, "files": files})
    assert error["path"] == "$.files[1].path"
    assert error["message"].startswith('repeats "SmolLM2-135M-Instruct.Q4_1.gguf"')


def test_gguf_manifest_may_carry_other_files_beside_its_gguf():
    files = [GGUF_FILE, _file("README.md")]
    assert len(structure({**MANIFEST, "files": files}, ModelManifest).files) == 2


def test_gguf_manifest_refuses_no_gguf_file():
    assert _refusal({**MANIFEST, "files": [_file("model.bin")]}) == {
        "path": "$.files",
        "message": 'must hold exactly one ".gguf" file for format "gguf", or every part of '
        "one split GGUF (<name>-00001-of-0000N.gguf ...), found 0",
    }


def test_gguf_manifest_refuses_two_gguf_files():
    files = [_file("a.gguf"), _file("b.gguf")]
    assert _refusal({**MANIFEST, "files": files})["message"].endswith("found 2")


def test_hf_directory_manifest_accepts_config_json_at_the_top():
    manifest = structure({**MANIFEST, "format": "hf-directory", "files": HF_FILES}, ModelManifest)
    assert manifest.format == "hf-directory"


def test_hf_directory_manifest_refuses_a_nested_config_json_only():
    files = [_file("sub/config.json"), _file("model.safetensors")]
    error = _refusal({**MANIFEST, "format": "hf-directory", "files": files})
    assert error["path"] == "$.files"
    assert "config.json" in error["message"]


def test_named_constructors_build_each_format():
    gguf_file = structure(GGUF_FILE, ModelFile)
    hf_files = [structure(file, ModelFile) for file in HF_FILES]
    source = ModelSource(repository="HuggingFaceTB/SmolLM2-135M-Instruct", revision="main")
    gguf = ModelManifest.gguf("SmolLM2", gguf_file, licence="apache-2.0", source=source)
    directory = ModelManifest.hf_directory("SmolLM2 HF", hf_files)
    assert (gguf.format, gguf.files, gguf.source) == ("gguf", (gguf_file,), source)
    assert (directory.format, directory.files) == ("hf-directory", tuple(hf_files))


def test_manifest_size_is_the_sum_of_its_files():
    manifest = structure({**MANIFEST, "format": "hf-directory", "files": HF_FILES}, ModelManifest)
    assert manifest.size == 700 + 269060552 + 2104556


def test_equal_manifests_have_equal_digests():
    reordered = {key: MANIFEST[key] for key in reversed(list(MANIFEST))}
    assert (
        structure(reordered, ModelManifest).digest() == structure(MANIFEST, ModelManifest).digest()
    )


def test_a_different_file_digest_changes_the_manifest_digest():
    changed = {**MANIFEST, "files": [{**GGUF_FILE, "sha256": "1f" * 32}]}
    assert structure(changed, ModelManifest).digest() != structure(MANIFEST, ModelManifest).digest()


def test_absent_licence_and_source_are_omitted():
    manifest = structure(MANIFEST, ModelManifest)
    assert (manifest.licence, manifest.source) == (None, None)


def test_source_refuses_an_empty_revision():
    error = _refusal({"repository": "a/b", "revision": ""}, ModelSource)
    assert error == {"path": "$.revision", "message": "must not be empty"}


def test_gguf_manifest_accepts_every_part_of_one_split_gguf_and_orders_them():
    names = ["m/x-00002-of-00003.gguf", "m/x-00003-of-00003.gguf", "m/x-00001-of-00003.gguf"]
    files = [_file(name) for name in names] + [_file("README.md")]
    manifest = structure({**MANIFEST, "files": files}, ModelManifest)
    assert [f.path for f in manifest.weights] == sorted(names)
    assert [f.path for f in structure(MANIFEST, ModelManifest).weights] == [GGUF_FILE["path"]]


@pytest.mark.parametrize(
    "names",
    [
        ["x-00001-of-00003.gguf", "x-00002-of-00003.gguf"],  # a part missing
        ["x-00001-of-00002.gguf", "y-00002-of-00002.gguf"],  # two prefixes
        ["x-00001-of-00002.gguf", "x-00002-of-00003.gguf"],  # two counts
        ["a/x-00001-of-00002.gguf", "b/x-00002-of-00002.gguf"],  # not side by side
        ["x-00001-of-00002.gguf", "x-00002-of-00002.gguf", "other.gguf"],
        ["x-00000-of-00001.gguf", "x-00001-of-00001.gguf"],  # no part 0
        ["x-00002-of-00003.gguf"],  # one part alone: the others are missing
    ],
)
def test_gguf_manifest_refuses_gguf_files_that_are_not_one_complete_split(names):
    error = _refusal({**MANIFEST, "files": [_file(name) for name in names]})
    assert error["path"] == "$.files"
    assert error["message"].endswith(f"found {len(names)}")
