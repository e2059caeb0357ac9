"""Day one, as a new operator does it: a plain `ficc serve`, then the CLI alone.

No flags but a data directory, no agent TOML, no hand-written specification: the
embedded node advertises the installed llama-server runtime, `ficc models add`
registers and uploads the real SmolLM2 GGUF, `ficc inference create` submits the
suggested specification for two replicas, and `ficc inference chat` gets an answer
from the real llama.cpp engine. Every command is the `ficc` executable in its own
process, with no FICC_* variable set: after `ficc login` each finds the stored login.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ..support.models_support import smollm2_path
from ..support.serve_support import ServeProcess, ficc_command

pytestmark = pytest.mark.slow


@pytest.mark.deadline(610)
async def test_plain_serve_login_add_create_and_chat_get_an_answer(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("FICC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    ficc = ficc_command(env)

    # Short: the engine's socket path lives under it (at most 107 bytes).
    data = Path(tempfile.mkdtemp(prefix="fd-", dir="/tmp"))
    serve = ServeProcess(data)
    try:
        with trio.fail_after(600):
            await serve.log_in_admin(ficc)
            # Named by the GGUF header's general.basename: the acceptance's "smollm2".
            added = await ficc("models", "add", str(smollm2_path()))
            assert "ficc inference create --model smollm2" in added  # the next step
            model = json.loads(await ficc("models", "show", "smollm2", "--json"))
            assert model["state"] == "verified"
            await ficc(
                "inference", "create", "--model", "smollm2", "--engine", "llama_cpp",
                "--replicas", "2", "--yes", "--wait",
            )  # fmt: skip
            service = json.loads(await ficc("inference", "show", "smollm2", "--json"))
            assert service["state"] == "ready"
            assert [r["state"] for r in service["replicas"]] == ["ready", "ready"]
            # The stored specification is explicit: the name resolved to the model's ID,
            # and the suggestion filled in the runtime and the limits.
            spec = service["spec"]
            assert spec["model_id"] == model["id"]
            assert spec["runtime"]["image_digest"].startswith("sha256:")
            assert all(p["limits"]["memory_bytes"] > 0 for p in spec["placements"])

            answer = await ficc(
                "inference", "chat", "smollm2", "--message", "Say hello.", "--max-tokens", "16"
            )
            assert answer.strip()
    finally:
        serve.proc.terminate()
        serve.kill()
        shutil.rmtree(data, ignore_errors=True)
