"""The floor of FICC's HTTP stack: a fixed JSON answer on hypercorn's trio worker.

``--kind asgi`` is a raw ASGI app (no framework); ``--kind quart`` is one Quart-Trio
route that awaits the request body and returns the same bytes. Both answer every
``POST`` with the stand-in engine's chat body, in one process (the PID the benchmark
reads CPU time from), with the access log off as ``ficc serve`` has it::

    python bench/floor_app.py --kind asgi --port 18002
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

sys.path.insert(0, str(Path(__file__).resolve().parent))

from standin import CHAT_BODY

HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(CHAT_BODY))]


async def asgi_app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": CHAT_BODY})


def quart_app():
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("floor")

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        await request.get_data()
        return Response(CHAT_BODY, content_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("asgi", "quart"), default="asgi")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    config.accesslog = None
    app = asgi_app if args.kind == "asgi" else quart_app()
    trio.run(serve, app, config)


if __name__ == "__main__":
    main()
