"""``maple_acp.config``: the config file, the environment, precedence and private directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maple_acp._exceptions import MapleAcpError
from maple_acp.config import (
    ConfigFile,
    ConfigFileError,
    PrivateDirectoryError,
    SettingError,
    default_config_file,
    default_data_dir,
    load_config,
    make_private_dir,
    parse_config,
    resolve_serve_settings,
    resolve_socket,
)

NO_FLAGS: dict[str, object] = {
    "socket": None,
    "data_dir": None,
    "allowed_roots": (),
    "max_connections": None,
    "grace": None,
    "relay_allow": (),
    "log_level": None,
    "log_format": None,
}


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_default_places_follow_xdg_and_fall_back_under_home() -> None:
    home = Path(os.path.expanduser("~"))
    assert default_data_dir({"XDG_DATA_HOME": "/xdg/data"}) == Path("/xdg/data/maple-acp")
    assert default_data_dir({}) == home / ".local/share/maple-acp"
    assert default_data_dir({"XDG_DATA_HOME": "relative"}) == home / ".local/share/maple-acp"
    assert default_config_file({"XDG_CONFIG_HOME": "/xdg/cfg"}) == Path(
        "/xdg/cfg/maple-acp/config.toml"
    )
    assert default_config_file({}) == home / ".config/maple-acp/config.toml"


def test_a_file_sets_every_serve_option_and_keeps_the_provider_section_raw(
    tmp_path: Path,
) -> None:
    path = write_config(
        tmp_path,
        f"""
socket = "{tmp_path}/run/acp.sock"
data_dir = "~/maple-data"
allowed_roots = ["{tmp_path}"]
max_connections = 3
grace = 12.5
relay_allow = ["GITHUB_TOKEN"]
log_level = "DEBUG"
log_format = "json"
default_model = "local/llama"
system_prompt = "Be brief."

[[providers]]
name = "local"
base_url = "http://127.0.0.1:11434/v1"
""",
    )
    config = load_config(path, {})
    settings = resolve_serve_settings(NO_FLAGS, {}, config)
    assert settings.socket == f"{tmp_path}/run/acp.sock"
    assert settings.data_dir == Path(os.path.expanduser("~/maple-data"))
    assert settings.allowed_roots == (str(tmp_path),)
    assert settings.max_connections == 3
    assert settings.grace == 12.5
    assert settings.relay_allow == ("GITHUB_TOKEN",)
    assert settings.log_level == "debug"
    assert settings.log_format == "json"
    assert config.providers == {
        "default_model": "local/llama",
        "system_prompt": "Be brief.",
        "providers": [{"name": "local", "base_url": "http://127.0.0.1:11434/v1"}],
    }


def test_precedence_is_flag_then_environment_then_file_then_default(tmp_path: Path) -> None:
    config = parse_config(
        'data_dir = "/from/file"\nlog_level = "error"\nsocket = "/file/acp.sock"\n'
        "max_connections = 2\n",
        tmp_path / "c.toml",
    )
    env = {"MAPLE_ACP_DATA_DIR": "/from/env", "MAPLE_ACP_LOG_LEVEL": "warning"}
    # Defaults alone.
    plain = resolve_serve_settings(NO_FLAGS, {"XDG_DATA_HOME": "/xdg"}, ConfigFile())
    assert plain.data_dir == Path("/xdg/maple-acp")
    assert (plain.log_level, plain.max_connections, plain.socket) == ("info", 8, None)
    # The file over the defaults.
    from_file = resolve_serve_settings(NO_FLAGS, {}, config)
    assert from_file.data_dir == Path("/from/file")
    assert from_file.log_level == "error"
    assert from_file.socket == "/file/acp.sock"
    # The environment over the file (options it does not name keep the file's value).
    from_env = resolve_serve_settings(NO_FLAGS, {**env, "MAPLE_ACP_SOCKET": "/env.sock"}, config)
    assert from_env.data_dir == Path("/from/env")
    assert from_env.log_level == "warning"
    assert from_env.socket == "/env.sock"
    assert from_env.max_connections == 2
    # Flags over everything.
    flags = {**NO_FLAGS, "data_dir": "/flag", "log_level": "debug", "max_connections": 5}
    from_flags = resolve_serve_settings(flags, env, config)
    assert from_flags.data_dir == Path("/flag")
    assert from_flags.log_level == "debug"
    assert from_flags.max_connections == 5


def test_status_and_sessions_find_the_socket_by_the_same_precedence(tmp_path: Path) -> None:
    config = parse_config('socket = "/file.sock"\n', tmp_path / "c.toml")
    assert resolve_socket(None, {}, config) == "/file.sock"
    assert resolve_socket(None, {"MAPLE_ACP_SOCKET": "/env.sock"}, config) == "/env.sock"
    assert resolve_socket("/flag.sock", {"MAPLE_ACP_SOCKET": "/env.sock"}, config) == "/flag.sock"
    assert resolve_socket(None, {"MAPLE_ACP_SOCKET": ""}, ConfigFile()) is None


def test_an_empty_environment_value_counts_as_unset(tmp_path: Path) -> None:
    config = parse_config('log_level = "error"\n', tmp_path / "c.toml")
    settings = resolve_serve_settings(NO_FLAGS, {"MAPLE_ACP_LOG_LEVEL": ""}, config)
    assert settings.log_level == "error"


def test_a_bad_log_level_in_the_environment_is_one_line_naming_the_variable() -> None:
    with pytest.raises(SettingError) as caught:
        resolve_serve_settings(NO_FLAGS, {"MAPLE_ACP_LOG_LEVEL": "loud"}, ConfigFile())
    message = str(caught.value)
    assert message.startswith("MAPLE_ACP_LOG_LEVEL: must be one of debug, info")
    assert "'loud'" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("max_connections = 9", "max_connections", "must be an integer from 1 to 8"),
        ("max_connections = true", "max_connections", "must be an integer from 1 to 8"),
        ('max_connections = "4"', "max_connections", "must be an integer from 1 to 8"),
        ("grace = -1", "grace", "must be a number of seconds from 0 to"),
        ("grace = inf", "grace", "must be a number of seconds from 0 to"),
        ("grace = nan", "grace", "must be a number of seconds from 0 to"),
        ('data_dir = "relative/dir"', "data_dir", "must be an absolute path"),
        ("data_dir = 3", "data_dir", "must be a non-empty string"),
        ('allowed_roots = "/one"', "allowed_roots", "must be a list of absolute paths"),
        ('relay_allow = ["A-B"]', "relay_allow", "'A-B' is not an environment variable name"),
        ('log_level = "loud"', "log_level", "must be one of debug, info, warning, error"),
        ('log_format = "xml"', "log_format", "must be one of text, json"),
        ('data-dir = "/x"', "data-dir", "unknown key"),
        ("[serve]\nsocket = '/x'", "serve", "unknown key"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    path = write_config(tmp_path, text + "\n")
    with pytest.raises(ConfigFileError) as caught:
        load_config(path, {})
    error = caught.value
    assert isinstance(error, MapleAcpError)
    message = str(error)
    assert message.startswith(f"config file {path}: {key}: {problem}")
    assert "\n" not in message
    assert (error.key, error.path) == (key, str(path))


def test_a_file_that_is_not_toml_names_the_file_and_the_place(tmp_path: Path) -> None:
    path = write_config(tmp_path, "max_connections = = 3\n")
    with pytest.raises(ConfigFileError, match=r"config file .*: not valid TOML: .*line 1"):
        load_config(path, {})


def test_an_explicit_file_must_exist_but_the_default_one_may_not(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="no such file"):
        load_config(tmp_path / "missing.toml", {})
    assert load_config(None, {"XDG_CONFIG_HOME": str(tmp_path / "nothing")}) == ConfigFile()


def test_the_default_file_is_read_from_xdg_config_home(tmp_path: Path) -> None:
    (tmp_path / "maple-acp").mkdir()
    (tmp_path / "maple-acp" / "config.toml").write_text("max_connections = 4\n")
    config = load_config(None, {"XDG_CONFIG_HOME": str(tmp_path)})
    assert config.serve == {"max_connections": 4}
    assert config.path == tmp_path / "maple-acp" / "config.toml"


def test_a_file_that_is_not_utf8_or_too_large_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b"log_level = '\xff'\n")
    with pytest.raises(ConfigFileError, match="not UTF-8"):
        load_config(path, {})
    path.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(ConfigFileError, match="larger than"):
        load_config(path, {})


def test_private_dirs_are_created_0700_component_by_component(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = make_private_dir(tmp_path / "a" / "b" / "c", "data directory")
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert path.stat().st_mode & 0o777 == 0o700, path
    # An existing private directory is accepted as it is.
    assert make_private_dir(made) == made


def test_a_shared_directory_is_refused_with_the_fix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(PrivateDirectoryError) as caught:
        make_private_dir(shared, "data directory")
    assert str(caught.value) == (
        f"cannot use the data directory {shared}: its mode 0755 grants access to group or "
        f"others; make it private with: chmod 700 {shared}"
    )
    assert shared.stat().st_mode & 0o777 == 0o755  # never repaired behind the user's back


def test_a_symlink_or_a_file_is_refused_with_its_own_fix(tmp_path: Path) -> None:
    real = make_private_dir(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(PrivateDirectoryError, match="symbolic link; use the real directory"):
        make_private_dir(link, "socket directory")
    plain = tmp_path / "file"
    plain.write_text("")
    with pytest.raises(PrivateDirectoryError, match=r"cannot use the data directory .*file: it is"):
        make_private_dir(plain, "data directory")
    # A file where a parent should be: the path and the OS reason, one line.
    with pytest.raises(PrivateDirectoryError, match="not a directory") as caught:
        make_private_dir(plain / "below", "data directory")
    assert "\n" not in str(caught.value)
