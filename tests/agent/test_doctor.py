"""``ficc doctor`` on this machine: the real isolation probes, runtimes, disk and a real
controller on loopback (reachability, TLS, clock)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ficc_core.agent.doctor import (
    Status,
    disk_findings,
    gpu_findings,
    isolation_findings,
    runtime_findings,
    skew_finding,
)

from ..conftest import issue_token
from ..support.agent_support import open_controller
from ..support.inference_support import write_agent_settings
from ..support.serve_support import FICC


@pytest.fixture
def folder():
    path = Path(tempfile.mkdtemp(prefix="fd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _doctor(*args: str, **variables: str) -> tuple[int, str]:
    env = {**os.environ, **variables}
    env.pop("FICC_CONFIG", None)
    with trio.fail_after(120):
        done = await trio.run_process(
            [*FICC, "doctor", *args], capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


@pytest.mark.deadline(60)
async def test_doctor_reports_this_machines_real_facts_and_a_reachable_controller(tmp_path, folder):
    settings = write_agent_settings(folder)
    async with open_controller(tmp_path) as (_service, url):
        code, out = await _doctor(
            "--agent-dir",
            str(folder / "agent"),
            "--agent-config",
            str(settings),
            "--controller",
            url,
            "--json",
        )
    assert code == 0, out
    findings = {f["check"]: f for f in json.loads(out)["findings"]}
    # Tests run where the process provider isolates engines (they launch real ones).
    assert findings["isolation"]["status"] == "OK"
    assert "network namespace" in findings["isolation"]["message"]
    for limit in ("limits.memory", "limits.cpu", "limits.pids"):
        assert findings[limit]["status"] in ("OK", "WARN")
    runtime = findings["runtime/llama_server"]
    assert runtime["status"] == "OK" and "sha256:" in runtime["message"]
    assert findings["gpus"]["message"].startswith("no GPUs")  # this machine has none
    assert findings["disk"]["status"] in ("OK", "WARN")
    assert findings["controller"]["status"] == "OK"
    assert findings["tls"]["message"] == "plain HTTP on loopback"
    assert findings["clock"]["status"] == "OK"


@pytest.mark.deadline(60)
async def test_a_runtime_with_a_wrong_digest_is_a_fail_with_its_fix(tmp_path, folder):
    engine = folder / "llama-server"
    engine.write_text("#!/bin/sh\necho engine\n")
    engine.chmod(0o755)
    settings = folder / "agent.toml"
    wrong = "sha256:" + "0" * 64
    settings.write_text(
        f'[[runtimes]]\nname = "mine"\nprovider = "process"\nimage_digest = "{wrong}"\n'
        f'executable = "{engine}"\n'
    )
    code, out = await _doctor("--agent-dir", str(folder / "agent"), "--agent-config", str(settings))
    assert code == 1, out
    [line] = [line for line in out.splitlines() if "runtime/mine" in line]
    assert line.startswith("FAIL") and wrong in line
    fix = out.splitlines()[out.splitlines().index(line) + 1]
    assert "-> " in fix and 'image_digest = "sha256:' in fix and wrong not in fix


@pytest.mark.deadline(60)
async def test_an_unreachable_controller_is_a_fail(folder):
    code, out = await _doctor(
        "--agent-dir", str(folder / "agent"), "--controller", "http://127.0.0.1:9"
    )
    assert code == 1
    assert any(line.startswith("FAIL  controller") for line in out.splitlines()), out


def test_weak_limits_warn_and_missing_isolation_fails():
    labels = {
        "isolation.network": "unavailable",
        "isolation.problem": "unshare: operation not permitted",
        "limits.memory": "rlimit-as",
        "limits.cpu": "cgroup-v2",
        "limits.pids": "none",
    }
    found = {f.check: f for f in isolation_findings(labels, ["process"])}
    assert found["isolation"].status == Status.FAIL and "operation not permitted" in (
        found["isolation"].message
    )
    assert found["limits.memory"].status == Status.WARN and found["limits.memory"].fix
    assert found["limits.cpu"].status == Status.OK
    assert found["limits.pids"].status == Status.WARN


def test_clock_gpu_disk_and_runtime_thresholds():
    assert skew_finding(0.4).status == Status.OK
    assert skew_finding(-5).status == Status.WARN
    assert skew_finding(45).status == Status.FAIL
    assert gpu_findings((), "nvidia-smi", None, "nvidia-smi exited 9").pop().status == Status.FAIL
    assert disk_findings(512 << 20, "/x")[0].status == Status.FAIL
    assert disk_findings(5 << 30, "/x")[0].status == Status.WARN
    [missing] = runtime_findings([], {"r": "cannot read /nope: No such file or directory"})
    assert missing.status == Status.FAIL and "install" in missing.fix


@pytest.mark.deadline(130)
async def test_the_controller_asks_a_connected_node_for_its_doctor_findings(tmp_path):
    from ..support.inference_support import open_inference_controller

    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            answer = await controller.ok("GET", "/api/v1/contributors/local/doctor")
            await controller.service.contributors.add_node("never-connected")
            absent = await controller.call("GET", "/api/v1/contributors/never-connected/doctor")
            unknown = await controller.call("GET", "/api/v1/contributors/nope/doctor")
            reader = await issue_token(controller.service, scopes={"inference:read"})
            forbidden = await controller.call(
                "GET", "/api/v1/contributors/local/doctor", token=reader
            )
    findings = {f["check"]: f for f in answer["findings"]}
    assert answer["node"] == "local" and answer["ok"] is True
    assert findings["isolation"]["status"] == "OK"
    assert findings["runtime/llama_server"]["status"] == "OK"
    assert {"gpus", "disk", "clock"} <= set(findings)
    assert findings["clock"]["status"] == "OK"  # the same machine's clock
    # The node's own directories, the real ones its engines use.
    assert findings["agent_dir"]["status"] == "OK"
    assert findings["runtime_dir"]["status"] == "OK"
    assert "engine sockets in /tmp/ficc-" in findings["runtime_dir"]["message"]
    assert (absent.status_code, absent.json()["error"]["code"]) == (502, "node_unavailable")
    assert unknown.status_code == 404
    assert forbidden.status_code == 403


@pytest.mark.deadline(60)
async def test_a_runtime_directory_too_long_for_an_engine_socket_fails_in_one_line(folder):
    """Every launch would fail there: doctor says so, naming the setting, and exits 1."""
    too_long = "/tmp/" + "r" * 70
    code, out = await _doctor("--agent-dir", str(folder / "agent"), FICC_RUNTIME_DIR=too_long)
    assert code == 1, out
    [line] = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert line.split()[1] == "runtime_dir"
    assert "107-byte limit" in line and too_long in line
    assert "set runtime_dir (--runtime-dir, FICC_RUNTIME_DIR)" in line
    assert not await trio.to_thread.run_sync(os.path.lexists, too_long)


@pytest.mark.deadline(60)
async def test_doctor_checks_the_real_agent_directory_and_keeps_what_an_agent_holds(folder):
    # An attempt record as a running agent keeps it: the doctor's probes must not adopt it.
    record = folder / "agent" / "process" / "attempts" / "a0123" / "attempt.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"attempt_id": "held"}')
    code, out = await _doctor("--agent-dir", str(folder / "agent"), "--json")
    assert code == 0, out
    findings = {f["check"]: f for f in json.loads(out)["findings"]}
    assert findings["agent_dir"] == {
        "check": "agent_dir",
        "status": "OK",
        "message": f"{folder / 'agent'} is writable",
    }
    assert findings["runtime_dir"]["status"] == "OK"
    assert record.read_text() == '{"attempt_id": "held"}'
    # Its own probe directory inside the agent directory is gone.
    assert sorted(p.name for p in (folder / "agent").iterdir()) == ["process"]

    (folder / "file").write_text("not a directory")
    code, out = await _doctor("--agent-dir", str(folder / "file" / "agent"))
    assert code == 1, out
    [line] = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert line.split()[1] == "agent_dir" and "Not a directory" in line
    fix = out.splitlines()[out.splitlines().index(line) + 1]
    assert "--agent-dir (FICC_AGENT_DIR, setting agent_dir)" in fix
