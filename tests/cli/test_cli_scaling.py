"""``ficc inference create|rollout --min --max --idle-timeout``, ``show``'s scaling lines and
``list``'s SCALING column, against a real controller with an embedded agent and llama.cpp
(SmolLM2), as tests/cli/test_cli_inference.py runs the other commands."""

from __future__ import annotations

import re

import pytest
import trio

from ficc_core.cli.inference_scaling import scaling_cell, scaling_lines

from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2
from .test_cli_inference import Cli, _service_id, write_json, write_toml


@pytest.mark.deadline(130)
async def test_scaling_flags_reach_the_specification_and_show_says_how_it_scales(tmp_path):
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)

            # Suggested from the model: the flags are in the partial specification preview
            # completes, and come back in the suggestion (nothing submitted without --yes).
            suggested = await run.json(
                "create",
                "--model",
                "smollm2",
                "--engine",
                "llama_cpp",
                "--replicas",
                "2",
                "--min",
                "0",
                "--max",
                "2",
                "--idle-timeout",
                "15m",
            )
            spec = suggested["preview"]["spec"]
            assert spec["scaling"] == {"min": 0, "max": 2, "idle_timeout": 900}
            assert len(spec["placements"]) == 2
            assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []

            # A duration that is not one is refused before anything is sent.
            bad = await run("create", "--model", "smollm2", "--engine", "llama_cpp",
                            "--idle-timeout", "soon")  # fmt: skip
            assert bad.exit_code == 2 and "not a duration" in bad.stderr
            zero = await run("create", "--model", "smollm2", "--engine", "llama_cpp",
                             "--idle-timeout", "0")  # fmt: skip
            assert zero.exit_code == 2 and "must be more than 0" in zero.stderr
            negative = await run("create", "--model", "smollm2", "--engine", "llama_cpp",
                                 "--min", "-1")  # fmt: skip
            assert negative.exit_code == 2

            # What only the controller knows (its placements) is its refusal, by path.
            base = await llama_spec(controller, model_id, memory_bytes=512 << 20)
            spec_file = write_toml(tmp_path / "smol.toml", base)
            too_many = await run("create", str(spec_file), "--min", "3")
            assert too_many.exit_code == 1 and "[invalid_request]" in too_many.stderr
            assert "$.scaling.min" in too_many.stderr and "placements (1)" in too_many.stderr
            assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []

            # With SPEC_FILE the flags go over the file's own scaling block, field by field.
            scaled_file = write_json(
                tmp_path / "scaled.json", {**base, "scaling": {"min": 1, "idle_timeout": 60}}
            )
            created = await run.ok("create", str(scaled_file), "--min", "0")
            service_id = _service_id(created)
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["spec"]["scaling"] == {"min": 0, "idle_timeout": 60}
            assert view["scaling"]["min"] == 0 and view["scaling"]["max"] == 1

            shown = await run.ok("show", "smol")
            assert re.search(
                r"^scaling:\s+0 of at most 1 replica running \(min 0, idle timeout 1m\)$",
                shown.stdout,
                re.M,
            ), shown.stdout
            assert "pinned" not in shown.stdout
            assert (await run.json("show", "smol"))["scaling"]["running"] == 0
            listed = await run.ok("list")
            assert re.search(rf"^{service_id}\s.*\s0/1 min 0$", listed.stdout, re.M), listed.stdout

            # Its one placement is a candidate that runs nothing yet: not held.
            assert re.search(r"^0\s+local\s+not held\s+-\s+-$", shown.stdout, re.M), shown.stdout

            # Preview plans every candidate and says which are only planned.
            two = write_json(
                tmp_path / "two.json",
                {**base, "alias": "two", "placements": base["placements"] * 2,
                 "scaling": {"min": 1}},
            )  # fmt: skip
            planned = await run.ok("preview", str(two))
            assert re.search(r"^REPLICA\s+NODE\s+CPUS\s+MEMORY\s+GPUS\s+DISK\s+FITS\s+HELD$",
                             planned.stdout, re.M)  # fmt: skip
            assert re.search(r"^0\s+local\s+1\s+512 MiB\s+-\s+-\s+yes\s+yes$", planned.stdout, re.M)
            assert re.search(r"^1\s+local\s+1\s+512 MiB\s+-\s+-\s+yes\s+planned$",
                             planned.stdout, re.M)  # fmt: skip
            assert re.search(
                r"^scaling:\s+min 1, max 2; held at the start: 1, planned \(not held\): 1; "
                r"2 fit together, max fits$",
                planned.stdout,
                re.M,
            ), planned.stdout
            unscaled = (await run.ok("preview", str(spec_file))).stdout
            assert "HELD" not in unscaled and "scaling:" not in unscaled

            # A service without scaling has no scaling line and "-" in the list.
            plain = await run.ok("create", str(write_json(tmp_path / "plain.json",
                                                          {**base, "alias": "plain"})))  # fmt: skip
            plain_id = _service_id(plain)
            assert "scaling:" not in (await run.ok("show", plain_id)).stdout
            listed = await run.ok("list")
            assert re.search(rf"^{plain_id}\s.*\s-$", listed.stdout, re.M), listed.stdout
            # Pinning is for scaled services: the controller's refusal, its code.
            refused = await run("pin", "plain")
            assert refused.exit_code == 1 and "[not_scaled]" in refused.stderr


@pytest.mark.deadline(190)
async def test_rollout_changes_only_the_scaling_fields_given(tmp_path):
    with trio.fail_after(180):
        async with open_inference_controller(tmp_path) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)
            spec = await llama_spec(
                controller, model_id, memory_bytes=512 << 20, scaling={"min": 1, "max": 1}
            )
            spec_file = write_json(tmp_path / "smol.json", spec)
            service_id = _service_id(await run.ok("create", str(spec_file), "--idle-timeout", "2h"))
            await run.ok("start", service_id, "--wait", "--interval", "0.1")

            rolled = await run.ok(
                "rollout", "smol", "--idle-timeout", "20m", "--wait", "--interval", "0.1"
            )
            assert "serves" in rolled.stdout, rolled.output
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["spec"]["scaling"] == {"min": 1, "max": 1, "idle_timeout": 1200}
            assert view["generation"] == 2
            shown = await run.ok("show", service_id)
            assert re.search(
                r"^scaling:\s+\d of at most 1 replica running \(min 1, idle timeout 20m\)$",
                shown.stdout,
                re.M,
            ), shown.stdout

            # The controller's refusal of a bound beyond the placements, the current
            # generation left serving.
            refused = await run("rollout", "smol", "--max", "2")
            assert refused.exit_code == 1 and "$.scaling.max" in refused.stderr
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ] == 2


def _view(**scaling: object) -> dict:
    block = {"min": 0, "max": 3, "idle_timeout": 900, "pinned": False, "active": [], "running": 0}
    return {"state": "idle", "reason": "no request for 900 s", "scaling": {**block, **scaling}}


def test_show_lines_for_an_idle_a_running_and_a_pinned_service():
    idle = _view()
    assert scaling_lines(idle) == [
        "scaling:      0 of at most 3 replicas running (min 0, idle timeout 15m)",
        "idle:         no request for 900 s; the next request wakes it",
    ]
    # A reason that already says how it wakes, or that it is idle, is not said twice.
    worded = {**idle, "reason": "idle: no request for 900 s; the next request wakes it"}
    failed = {**idle, "reason": "idle: the last activation failed (x); a request tries again"}
    assert (
        scaling_lines(failed)[1]
        == "idle:         the last activation failed (x); a request tries again"
    )
    assert (
        scaling_lines(worded)[1] == "idle:         no request for 900 s; the next request wakes it"
    )
    running = {**_view(active=[0, 2], running=2, pinned=True, idle_timeout=None), "state": "ready"}
    assert scaling_lines(running) == [
        "scaling:      2 of at most 3 replicas running (min 0, idle timeout the idle_timeout "
        "setting), pinned",
        "active:       placements 0, 2",
    ]
    assert scaling_cell(running) == "2/3 min 0 pinned"
    assert scaling_lines({"state": "ready"}) == [] and scaling_cell({"state": "ready"}) == "-"
    assert "idle timeout 90.5s" in scaling_lines(_view(idle_timeout=90.5))[0]
