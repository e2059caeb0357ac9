"""Run a provider in its own process, launch the stand-in engine, then wait to be killed.

Tests of "the provider's host process dies" use this::

    python -m ficc_core.testing.provider_host --provider pkg.mod:Class \\
        --options '{"state_dir": "/tmp/x"}' [--job-factory pkg.mod:function] [--lease S]

It prints one JSON line once the engine is ready — the fence, and what the engine
reports from ``GET /env`` and ``POST /spawn`` (its PID and a session-leader
child's PID) — and then serves until it is killed. The attempt is held for
``--lease`` seconds (default an hour) through the provider's optional ``hold``,
as an agent would, so a killed host's engine outlives it for that long only.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

import attrs
import trio

from . import executor_kit


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


async def _main(args: argparse.Namespace) -> None:
    provider = _load(args.provider)(**json.loads(args.options))
    job_factory = _load(args.job_factory) if args.job_factory else executor_kit.standin_job
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        fence = executor_kit.new_fence()
        await provider.launch(job_factory(), fence)
        hold = getattr(provider, "hold", None)
        if hold is not None:
            hold(fence, args.lease)
        status = await provider.wait_ready(fence)
        assert status.state == "ready", status
        _, env = await executor_kit.request_json(provider, fence, "GET", "/env")
        _, spawned = await executor_kit.request_json(provider, fence, "POST", "/spawn", {})
        report = {
            "fence": attrs.asdict(fence),
            "engine_pid": env["pid"],
            "child_pid": spawned["pid"],
        }
        print(json.dumps(report), flush=True)
        await trio.sleep_forever()


def main() -> None:
    """Parse the command line and run until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--job-factory", default=None)
    parser.add_argument("--lease", type=float, default=3600.0)
    trio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
