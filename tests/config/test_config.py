"""Configuration: defaults, TOML file, FICC_* variables and flags, in that order."""

from __future__ import annotations

from pathlib import Path

import pytest

from ficc_core.base.errors import ConfigError
from ficc_core.config import Config, load_config, parse_duration
from ficc_core.devtools.docs_config import DOC, rendered


def test_embedded_defaults_need_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    config = load_config(environ={})
    assert config.host == "127.0.0.1"
    assert config.port == 8484
    assert config.data_dir == tmp_path / ".local" / "share" / "ficc"
    assert config.database_path == config.data_dir / "ficc.sqlite3"


def test_file_then_environment_then_flags_each_override_the_previous(tmp_path):
    path = tmp_path / "ficc.toml"
    path.write_text('port = 9000\nhost = "0.0.0.0"\nsession_lifetime = "2h"\n')
    from_file = load_config(path, environ={})
    assert (from_file.port, from_file.host, from_file.session_lifetime) == (9000, "0.0.0.0", 7200)
    from_env = load_config(path, environ={"FICC_PORT": "9100"})
    assert (from_env.port, from_env.host) == (9100, "0.0.0.0")
    from_flag = load_config(path, environ={"FICC_PORT": "9100"}, overrides={"port": 9200})
    assert from_flag.port == 9200


def test_the_file_can_be_named_by_FICC_CONFIG(tmp_path):
    path = tmp_path / "named.toml"
    path.write_text("max_body_bytes = 4096\n")
    assert load_config(environ={"FICC_CONFIG": str(path)}).max_body_bytes == 4096


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("colour = 'blue'\n", "unknown setting"),
        ("port = 'many'\n", "port must be a int"),
        ("secure_cookies = 'perhaps'\n", "secure_cookies must be a bool"),
        ("log_level = 'loud'\n", "log_level"),
        ("port = [\n", "not valid TOML"),
        ("metrics_listen = '9484'\n", "metrics_listen: '9484' is not host:port"),
        ("metrics_listen = '[::1]:99999'\n", "metrics_listen"),
    ],
)
def test_bad_files_are_refused_with_the_setting_named(tmp_path, document, message):
    path = tmp_path / "bad.toml"
    path.write_text(document)
    with pytest.raises(ConfigError, match=message):
        load_config(path, environ={})


def test_a_missing_file_is_refused():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Path("/nonexistent/ficc.toml"), environ={})


def test_environment_values_are_parsed_by_type():
    config = load_config(
        environ={"FICC_SECURE_COOKIES": "yes", "FICC_SHUTDOWN_GRACE": "250ms", "FICC_PORT": "0"}
    )
    assert config.secure_cookies is True
    assert config.shutdown_grace == 0.25
    assert config.port == 0
    with pytest.raises(ConfigError, match="FICC_PORT"):
        load_config(environ={"FICC_PORT": "eighty"})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("250ms", 0.25), ("15m", 900.0), ("12h", 43200.0), ("30d", 2592000.0), (5, 5.0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5", "5 weeks", True])
def test_bad_durations_are_refused(text):
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_tls_needs_both_files():
    assert not Config(tls_certfile="/c.pem").tls
    assert Config(tls_certfile="/c.pem", tls_keyfile="/k.pem").tls


def test_the_configuration_reference_in_docs_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert text == rendered(text), "run `python -m ficc_core.devtools.docs_config`"
