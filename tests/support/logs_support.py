"""A replica whose engine writes known log lines, and an SSE reader, for the logs tests."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import trio

from .inference_support import Controller, write_agent_settings
from .models_support import random_bytes

#: The lines the stand-in llama-server prints before it serves.
STARTUP_LINES = 30

_ENGINE = """#!{python}
# A stand-in for llama-server: prints numbered lines, then serves the stand-in engine's
# routes (health, the OpenAI ones) on the Unix socket it is given with --host. Health
# probes and the gateway's /metrics reads leave no line, so the log changes only when
# the test makes it.
import sys
from ficc_core.testing import standin_engine
argv = sys.argv[1:]
sock = argv[argv.index("--host") + 1]
for number in range({lines}):
    print(f"fake llama-server line {{number}}", flush=True)
quiet = standin_engine._Handler.log_message
standin_engine._Handler.log_message = (
    lambda self, form, *args: (
        None
        if any(path in form % args for path in ("/health", "/metrics"))
        else quiet(self, form, *args)
    )
)
standin_engine.main(["--socket", sock])
"""


def logging_engine(folder: Path) -> tuple[Path, Path]:
    """The stand-in llama-server executable, and agent settings declaring it as the
    llama_server runtime."""
    engine = folder / "logging-llama-server"
    engine.write_text(_ENGINE.format(python=sys.executable, lines=STARTUP_LINES))
    engine.chmod(0o755)
    return engine, write_agent_settings(folder, engine)


async def tiny_model(controller: Controller, name: str = "tiny") -> str:
    """A small verified GGUF-named model (the stand-in engine never reads it)."""
    content = random_bytes(4096, seed=3)
    sha256 = hashlib.sha256(content).hexdigest()
    manifest = {
        "name": name,
        "format": "gguf",
        "files": [{"path": "tiny.gguf", "size": len(content), "sha256": sha256}],
    }
    model = await controller.ok("POST", "/api/v1/models", status=201, json=manifest)
    response = await controller.call(
        "POST",
        f"/api/v1/models/{model['id']}/files/0/bytes",
        params={"offset": 0},
        content=content,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code in (200, 201), response.text
    while (await controller.ok("GET", f"/api/v1/models/{model['id']}"))[  # noqa: ASYNC110
        "state"
    ] != "verified":
        await trio.sleep(0.02)
    return model["id"]


async def sse_items(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """The items of an event stream as they arrive: ``("data", line)``, ``("comment",
    text)`` or ``(event name, data)``."""
    event, data = "", []
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            yield event or "data", "\n".join(data)
            event, data = "", []


async def settled_log(controller: Controller, service_id: str) -> list[str]:
    """Wait until a ready replica 0's log ends with the stand-in's listening line (it
    writes nothing more while nobody calls it); return its lines."""
    path = f"/api/v1/inference/{service_id}/replicas/0/logs"
    with trio.fail_after(10):
        while True:
            lines = (await controller.ok("GET", path, params={"tail": 1000}))["lines"]
            if lines and "standin engine listening on" in lines[-1]:
                return lines
            await trio.sleep(0.05)
