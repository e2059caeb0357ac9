"""``ficc inference chat SERVICE``: a chat with a service from the terminal, streamed.

It posts to the service's OpenAI-compatible route
(``/api/v1/inference/{id}/v1/chat/completions``) with ``"stream": true`` and prints
the deltas of the server-sent events as they arrive. The credential is the
invocation's own (``ficc login``'s, ``--token`` or ``FICC_TOKEN``): a project
credential holding ``inference:invoke`` invokes every service of its project, so
no service-bound token is minted; a service-bound invoke token given with
``--token`` works too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click

from .client import ApiClient, ApiError, client_from
from .inference_io import BASE
from .options import url_flag
from .output import echo_json, hint, json_option
from .resolve import resolve


def _deltas(client: ApiClient, service_id: str, body: dict[str, Any]) -> Iterator[dict]:
    """The chunks of one streamed chat completion, in order, until ``[DONE]``."""
    route = f"{BASE}/{service_id}/v1/chat/completions"
    with client.stream("POST", route, json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                error = chunk["error"]
                raise click.ClickException(
                    f"{error.get('message', 'the stream failed')} [{error.get('code', 'error')}]"
                )
            yield chunk


def _answer(
    client: ApiClient, service_id: str, messages: list[dict[str, str]], *, quiet: bool, **opts
) -> dict[str, Any]:
    """Stream one answer to ``messages`` (printing it unless ``quiet``); return it."""
    body: dict[str, Any] = {"messages": messages, "stream": True, **opts}
    parts: list[str] = []
    finish = None
    for chunk in _deltas(client, service_id, body):
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                parts.append(text)
                if not quiet:
                    click.echo(text, nl=False)
                    sys.stdout.flush()
            finish = choice.get("finish_reason") or finish
    if not quiet:
        click.echo("")
    return {"role": "assistant", "content": "".join(parts), "finish_reason": finish}


@click.command("chat")
@click.argument("service_id", metavar="SERVICE")
@click.option("--message", "-m", help="Ask this one question, print the answer and exit.")
@click.option("--system", help="A system message that opens the conversation.")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Bound each answer's length.")
@json_option
@click.pass_context
def chat(
    ctx: click.Context,
    service_id: str,
    message: str | None,
    system: str | None,
    max_tokens: int | None,
    as_json: bool,
) -> None:
    """Chat with SERVICE (its ID or alias), the answers streamed as they come.

    With --message it asks once; otherwise each line read from standard input is
    a turn of one conversation, until end of input (Ctrl-D). Ctrl-C ends it.
    With --json each answer is printed as one JSON object once complete.
    Needs inference:invoke.
    """
    client = client_from(ctx)
    service_id = resolve(client, "inference", service_id)
    opts = {} if max_tokens is None else {"max_tokens": max_tokens}
    messages: list[dict[str, str]] = (
        [] if system is None else [{"role": "system", "content": system}]
    )
    interactive = message is None and sys.stdin.isatty()

    def turn(text: str) -> None:
        messages.append({"role": "user", "content": text})
        try:
            answer = _answer(client, service_id, messages, quiet=as_json, **opts)
        except ApiError as exc:
            if exc.code == "missing_scope":
                hint(
                    "this credential cannot invoke services; use one holding inference:invoke, "
                    f"or an invoke token: 'ficc inference token {service_id} --lifetime 1h"
                    f"{url_flag(client.url)}' "
                    "(run by someone holding inference:manage), then --token"
                )
            raise
        messages.append({"role": "assistant", "content": answer["content"]})
        if as_json:
            echo_json(answer)

    try:
        if message is not None:
            turn(message)
            return
        if interactive:
            hint(f"chatting with {service_id}; end with Ctrl-D or Ctrl-C")
        while True:
            if interactive:
                click.echo("> ", nl=False, err=True)
            line = sys.stdin.readline()
            if not line:
                break
            if line.strip():
                turn(line.rstrip("\n"))
    except KeyboardInterrupt:
        click.echo("", err=True)
        ctx.exit(130)
