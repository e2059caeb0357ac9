"""``ficc inference create``: a service from a specification file, or suggested from a model.

``create SPEC_FILE`` submits a complete specification. ``create --model M --engine E``
sends the partial specification it builds (alias, model, engine, context,
concurrency, one placement per replica with neither node nor limits, and the
routing fields given: description, more model names, fallbacks, context length,
maximum output) to
``POST /inference/preview``, shows the completed specification the controller
suggests (runtime, executable, limits, nodes) with any warning, and on
confirmation (``--yes`` for scripts) submits exactly that specification and starts
it. ``M`` is a model ID or name (the controller resolves it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .client import ApiClient, client_from
from .inference_control import _RESTING, _finish, _wait
from .inference_io import BASE, SPEC_FILE, echo_outcome, echo_plan, read_spec, refusals, seconds
from .inference_scaling import scaling_given, scaling_options, with_scaling
from .options import url_flag
from .output import echo_json


def partial_spec(
    *,
    model: str,
    engine: str,
    alias: str,
    replicas: int,
    context: int,
    concurrency: int,
    **routing: Any,
) -> dict[str, Any]:
    """The partial specification that preview completes: no runtime, nodes or limits.

    ``routing``: the optional fields (``description``, ``aliases``, ``fallbacks``,
    ``context_length``, ``max_output``); one that is None or empty is left out.
    """
    return {
        "alias": alias,
        "model_id": model,
        "engine": engine,
        "context": context,
        "concurrency": concurrency,
        "placements": [{} for _ in range(replicas)],
        **{name: value for name, value in routing.items() if value not in (None, ())},
    }


def echo_suggestion(preview: dict[str, Any]) -> None:
    """The completed specification in a few lines, the plan, what was filled, warnings."""
    spec = preview["spec"]
    runtime = spec["runtime"]
    click.echo(f"alias:       {spec['alias']}")
    click.echo(f"model:       {spec['model_id']}")
    click.echo(
        f"engine:      {spec['engine']} (context {spec['context']} x concurrency "
        f"{spec['concurrency']})"
    )
    click.echo(f"runtime:     {runtime['executor_provider']} {runtime['image_digest'][:19]}...")
    click.echo(f"executable:  {spec['image_executable']}")
    click.echo("")
    echo_plan(preview)
    if preview.get("suggested"):
        click.echo(f"suggested:   {', '.join(preview['suggested'])}")
    for warning in preview.get("warnings", []):
        click.echo(f"warning: {warning['message']} [{warning['code']}]", err=True)


@click.command("create")
@click.argument("spec_file", type=SPEC_FILE, required=False)
@click.option("--model", help="The model's ID or name (suggests the rest of the specification).")
@click.option("--engine", help="The engine adapter (llama_cpp, ollama, vllm, ...).")
@click.option("--alias", help="The service's alias (default: the --model given).")
@click.option("--replicas", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option(
    "--engine-context",
    "--context",
    "context",
    type=click.IntRange(1),
    default=2048,
    show_default=True,
    help="The engine's context window in tokens (its KV cache, which the memory limit "
    "is sized for); --context is the same flag. Not --context-length, which bounds one "
    "request.",
)
@click.option("--concurrency", type=click.IntRange(1), default=4, show_default=True)
@click.option("--description", help="What the service is for, in a line (/v1/models shows it).")
@click.option(
    "--also-as",
    "aliases",
    multiple=True,
    metavar="NAME",
    help="Another model name the project endpoint routes here (repeatable).",
)
@click.option(
    "--fallback",
    "fallbacks",
    multiple=True,
    metavar="ALIAS",
    help="A service of the project tried, in order, when this one cannot serve (repeatable).",
)
@click.option(
    "--context-length",
    type=click.IntRange(1),
    help="Tokens one request may use (default: --context, bounded by the model's own).",
)
@click.option("--max-output", type=click.IntRange(1), help="Tokens one completion may generate.")
@scaling_options
@click.option("--yes", is_flag=True, help="Submit the suggestion without asking.")
@click.option("--start/--no-start", default=True, help="Start it once created (--model).")
@click.option("--wait", is_flag=True, help="Wait until it is ready (with --start).")
@click.option("--timeout", default="10m", show_default=True, help="How long --wait waits.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def create(
    ctx: click.Context,
    spec_file: Path | None,
    model: str | None,
    engine: str | None,
    alias: str | None,
    replicas: int,
    context: int,
    concurrency: int,
    description: str | None,
    aliases: tuple[str, ...],
    fallbacks: tuple[str, ...],
    context_length: int | None,
    max_output: int | None,
    min_replicas: int | None,
    max_replicas: int | None,
    idle_timeout: str | None,
    yes: bool,
    start: bool,
    wait: bool,
    timeout: str,
    as_json: bool,
) -> None:
    """Submit SPEC_FILE, or a specification suggested for --model and --engine.

    With SPEC_FILE (JSON or TOML, `-`: JSON on standard input) the service is
    created stopped; `start` starts generation 1. With --model and --engine the
    controller suggests the runtime, executable, nodes and limits (memory: the
    weights plus the KV cache of context x concurrency, plus the engine's
    overhead); the suggestion is shown and, once confirmed (--yes), submitted as
    it is and started. With --json, the preview and the created service are
    printed as JSON and nothing is asked: give --yes to submit.

    --description, --also-as, --fallback, --context-length and --max-output set
    the specification's routing fields (see docs/inference.md); a SPEC_FILE
    carries its own.

    --min, --max and --idle-timeout set its scaling (with SPEC_FILE too, over the
    file's own): at most --max of the placements run, --min always; --min 0 makes
    it on-demand, idle until a request wakes it (see docs/inference.md, "Scaling
    and on-demand services").
    """
    scaling = scaling_given(min_replicas, max_replicas, idle_timeout)
    client = client_from(ctx)
    routing = {
        "description": description,
        "aliases": aliases,
        "fallbacks": fallbacks,
        "context_length": context_length,
        "max_output": max_output,
    }
    if spec_file is not None:
        if model or engine:
            raise click.UsageError("give SPEC_FILE or --model/--engine, not both")
        if any(value not in (None, ()) for value in routing.values()):
            raise click.UsageError(
                "--description, --also-as, --fallback, --context-length and --max-output "
                "go with --model; SPEC_FILE carries its own fields"
            )
        document = with_scaling(read_spec(spec_file), scaling)
        view = refusals(lambda: client.json("POST", BASE, json=document))
        if as_json:
            echo_json(view)
            return
        click.echo(f"{view['id']} {view['state']}")
        echo_outcome(view, "created")
        _start_hint(client, view)
        return
    if not model or not engine:
        raise click.UsageError("give SPEC_FILE, or --model and --engine")
    seconds(timeout, "--timeout")
    partial = partial_spec(
        model=model,
        engine=engine,
        alias=alias or model,
        replicas=replicas,
        context=context,
        concurrency=concurrency,
        **routing,
    )
    partial = with_scaling(partial, scaling)
    preview = refusals(lambda: client.json("POST", f"{BASE}/preview", json=partial))
    if as_json:
        if not yes:
            echo_json({"preview": preview})
            return
    else:
        echo_suggestion(preview)
    if not preview["fits"]:
        raise click.ClickException("the suggested specification does not fit; nothing submitted")
    if not yes and not click.confirm("create this service?", default=True, err=True):
        raise click.ClickException("nothing submitted")
    view = refusals(lambda: client.json("POST", BASE, json=preview["spec"]))
    if start:
        body = {"revision": view["revision"]}
        view = refusals(
            lambda: client.json("POST", f"{BASE}/{view['id']}/control/start", json=body)
        )
    if as_json:
        if start and wait:
            # One document: the service as it rests, not also the wait's own.
            _wait(
                client,
                view["id"],
                _RESTING["start"],
                timeout=seconds(timeout, "--timeout"),
                interval=0.5,
            )
            view = client.json("GET", f"{BASE}/{view['id']}")
        echo_json({"preview": preview, "service": view})
        return
    click.echo(f"{view['id']} {view['state']}")
    if start:
        _finish(client, view, "start", wait=wait, timeout=timeout, interval=0.5)
    else:
        echo_outcome(view, "created")
        _start_hint(client, view)


def _start_hint(client: ApiClient, view: dict[str, Any]) -> None:
    """How to start the created service, run as printed against this controller."""
    click.echo(f"start it with: ficc inference start {view['alias']}{url_flag(client.url)}")
