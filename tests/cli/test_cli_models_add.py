"""`ficc models add`, `pull` and `show` as real subprocesses against a real `ficc serve`.

The models are the real SmolLM2 GGUF and that GGUF split into three parts by the
``gguf`` package's own split writer; the hub is a loopback HTTPS stand-in
(trustme) speaking the Hugging Face API shapes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from ficc_core.models.gguf import read_gguf_file
from ficc_core.testing.models import split_gguf

from ..conftest import bearer
from ..support.httpsd import ServedFile, ServedJSON
from ..support.models_support import poll_model, sha256_of, smollm2_path, start_serve
from .test_cli_models import ficc

MiB = 1 << 20
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def split_parts(tmp_path_factory) -> list[Path]:
    """SmolLM2 as a split GGUF of three parts."""
    return split_gguf(smollm2_path(), tmp_path_factory.mktemp("split"), parts=3, stem="smol")


@pytest.mark.deadline(60)
async def test_add_resumes_an_interrupted_upload_and_show_prints_the_gguf_metadata(
    serve_process,
):
    gguf = pytest.importorskip("gguf")
    url, token = serve_process
    env = {"FICC_URL": url, "FICC_TOKEN": token}
    path = smollm2_path()
    content = path.read_bytes()
    manifest = {
        "name": "smollm2",
        "format": "gguf",
        "files": [{"path": path.name, "size": len(content), "sha256": sha256_of(path)}],
    }
    # An earlier `ficc models add` registered the model and was stopped after 16 MiB.
    async with httpx.AsyncClient(base_url=url, headers=bearer(token)) as http:
        model = (await http.post("/api/v1/models", json=manifest)).json()
        first = await http.post(
            f"/api/v1/models/{model['id']}/files/0/bytes?offset=0",
            content=content[: 16 * MiB],
            headers={"Content-Type": "application/octet-stream"},
        )
        assert first.json()["received_bytes"] == 16 * MiB

    added = await ficc("models", "add", str(path), "--name", "smollm2", env_extra=env)
    assert added.returncode == 0, added.stderr
    out = added.stdout.decode()
    assert f"added model smollm2 (ID {model['id']})" in out  # the same model, continued
    assert "verified" in out
    assert out.splitlines()[-1] == "next: ficc inference create --model smollm2 --engine llama_cpp"
    assert len(out.splitlines()) == 2  # short lines, not the model's JSON
    err = added.stderr.decode()
    assert f"resuming at byte {16 * MiB:,}" in err
    assert "hashing" in err and "%" in err  # progress lines for the hash and the upload

    # By name; the metadata as the GGUF says it (read here with the gguf package).
    reader = gguf.GGUFReader(path)
    context = int(reader.fields["llama.context_length"].contents())
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    shown = await ficc("models", "show", "smollm2", env_extra=env)
    assert shown.returncode == 0, shown.stderr
    lines = {
        line.split("  ", 1)[0]: line.split("  ", 1)[1].strip()
        for line in shown.stdout.decode().splitlines()
        if "  " in line and not line.startswith(" ")
    }
    assert lines["architecture"] == reader.fields["general.architecture"].contents() == "llama"
    assert lines["context length"] == str(context)
    assert lines["parameters"] == f"{parameters / 1e6:.1f}M"
    assert lines["quantisation"] == "Q4_1 (file type 3)"
    assert lines["chat template"] == "yes" and lines["embedding model"] == "no"
    assert f"0  {path.name}  verified" in shown.stdout.decode()

    as_json = json.loads((await ficc("models", "show", "smollm2", "--json", env_extra=env)).stdout)
    assert as_json["id"] == model["id"]
    assert as_json["metadata"] == read_gguf_file(path).to_json()
    assert as_json["metadata"]["context_length"] == context
    assert as_json["metadata"]["parameter_count"] == parameters

    # Registering it again: short human lines, the JSON only with --json.
    again = await ficc(
        "models", "register", "--gguf", str(path), "--name", "smollm2", env_extra=env
    )
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.decode().splitlines()) == 2
    assert b"next: ficc inference create --model smollm2" in again.stdout

    missing = await ficc("models", "show", "no-such-model", env_extra=env)
    assert missing.returncode != 0 and b"no-such-model" in missing.stderr


@pytest.mark.deadline(120)
async def test_add_of_any_part_registers_a_split_gguf_as_one_model(serve_process, split_parts):
    url, token = serve_process
    env = {"FICC_URL": url, "FICC_TOKEN": token}
    added = await ficc("models", "add", str(split_parts[1]), "--json", env_extra=env)
    assert added.returncode == 0, added.stderr
    model = json.loads(added.stdout)
    assert model["name"] == "smollm2"  # named by its header's general.basename
    assert model["state"] == "verified"
    assert [(f["path"], f["sha256"], f["state"]) for f in model["files"]] == [
        (part.name, sha256_of(part), "verified") for part in split_parts
    ]
    whole = read_gguf_file(smollm2_path())
    assert model["metadata"]["split_count"] == 3
    assert model["metadata"]["parameter_count"] == whole.parameter_count
    assert model["metadata"]["tensor_count"] == whole.tensor_count
    assert model["metadata"]["architecture"] == whole.architecture

    # A part missing beside the named one: refused before anything is registered.
    lonely = split_parts[0].parent.parent / "lonely"
    lonely.mkdir()
    (lonely / split_parts[0].name).symlink_to(split_parts[0])
    refused = await ficc("models", "add", str(lonely / split_parts[0].name), env_extra=env)
    assert refused.returncode != 0
    assert split_parts[1].name.encode() in refused.stderr
    listed = json.loads((await ficc("models", "list", "--json", env_extra=env)).stdout)
    assert [m["name"] for m in listed["models"]] == ["smollm2"]

    # An empty --name and a file not named .gguf are refused before hashing.
    empty = await ficc("models", "add", str(split_parts[1]), "--name", " ", env_extra=env)
    assert (
        empty.returncode == 2 and b"--name" in empty.stderr and b"must not be empty" in empty.stderr
    )
    plain = lonely / "model.bin"
    plain.symlink_to(split_parts[0])
    named = await ficc("models", "add", str(plain), env_extra=env)
    assert named.returncode == 2 and b"does not end in .gguf" in named.stderr
    assert b"hashing" not in named.stderr + named.stdout
    listed = json.loads((await ficc("models", "list", "--json", env_extra=env)).stdout)
    assert [m["name"] for m in listed["models"]] == ["smollm2"]


def _sibling(path: Path) -> dict:
    size = path.stat().st_size
    return {"rfilename": path.name, "size": size, "lfs": {"sha256": sha256_of(path), "size": size}}


@pytest.mark.deadline(60)
async def test_pull_previews_registers_and_acquires_single_and_split_ggufs(
    tmp_path, ca_bundle, https_server, split_parts
):
    single = smollm2_path()
    files = [single, *split_parts]
    https_server.add(
        f"/api/models/{REPO}/revision/main",
        ServedJSON({"id": REPO, "sha": COMMIT, "siblings": [_sibling(path) for path in files]}),
    )
    for path in files:
        https_server.add(f"/{REPO}/resolve/{COMMIT}/{path.name}", ServedFile(path))
    server, url = await start_serve(tmp_path, ca_bundle, f'hub_url = "{https_server.url("")}"\n')
    try:
        token = await server.admin_token()
        env = {"FICC_URL": url, "FICC_TOKEN": token}

        previews = json.loads(
            (await ficc("models", "preview", REPO, "--json", env_extra=env)).stdout
        )
        table = (await ficc("models", "preview", REPO, env_extra=env)).stdout.decode()
        [split_row] = [line for line in table.splitlines() if split_parts[0].name in line]
        assert split_row.split()[3:6] == ["3", "llama", "Q4_1"]  # one row, three parts
        split = [p for p in previews["previews"] if p.get("parts")]
        assert [p["filename"] for p in previews["previews"]] == [single.name, split_parts[0].name]
        assert split[0]["parts"] == [part.name for part in split_parts]
        assert split[0]["size"] == sum(part.stat().st_size for part in split_parts)
        assert len(split[0]["manifest"]["files"]) == 3

        # Two models in the repository: pull asks which, naming both.
        ambiguous = await ficc("models", "pull", REPO, env_extra=env)
        assert ambiguous.returncode != 0
        assert b"--file" in ambiguous.stderr
        assert single.name.encode() in ambiguous.stderr
        assert b"3 parts" in ambiguous.stderr

        # Any part names the split model; it is pulled as one model, every part verified.
        pulled = await ficc(
            "models", "pull", REPO, "--file", split_parts[2].name, "--name", "smol-split",
            "--interval", "0.1", env_extra=env,
        )  # fmt: skip
        assert pulled.returncode == 0, pulled.stderr
        out = pulled.stdout.decode()
        assert "pulled model smol-split" in out and "3 files" in out and "verified" in out
        assert out.splitlines()[-1].startswith("next: ficc inference create --model smol-split")
        assert b"MiB/s" in pulled.stderr
        shown = json.loads(
            (await ficc("models", "show", "smol-split", "--json", env_extra=env)).stdout
        )
        assert [f["state"] for f in shown["files"]] == ["verified"] * 3
        assert shown["manifest"]["source"] == {"repository": REPO, "revision": COMMIT}
        assert shown["metadata"]["split_count"] == 3

        # --no-wait returns while the acquisition runs; the model then verifies.
        started = await ficc(
            "models", "pull", REPO, "--file", single.name, "--no-wait", "--json", env_extra=env
        )
        assert started.returncode == 0, started.stderr
        model = json.loads(started.stdout)
        assert model["name"] == single.name.removesuffix(".gguf")
        async with httpx.AsyncClient(base_url=url, headers=bearer(token)) as http:
            done = await poll_model(http, model["id"], lambda m: m["state"] == "verified")
        assert done["files"][0]["sha256"] == hashlib.sha256(single.read_bytes()).hexdigest()
    finally:
        server.proc.terminate()
        server.kill()
