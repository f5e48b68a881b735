"""``tool_env_allow`` in the config file: the names a host adds to what tool children inherit.
Accepted and carried to ``serve``; a provider's key variable, a ``MAPLE_ACP_*`` name or
anything that is not a variable name is one config-error line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from e2e.host_processes import home_env

from maple_acp.cli import cli
from maple_acp.config import ConfigFileError, parse_config, resolve_serve_settings

NO_FLAGS: dict[str, object] = {"socket": None, "data_dir": None}


def test_tool_env_allow_is_accepted_and_reaches_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    config = parse_config('tool_env_allow = ["GOPATH", "CARGO_HOME", "GOPATH"]\n', path)
    assert config.serve["tool_env_allow"] == ("GOPATH", "CARGO_HOME")
    settings = resolve_serve_settings(NO_FLAGS, {}, config)
    assert settings.tool_env_allow == ("GOPATH", "CARGO_HOME")
    assert resolve_serve_settings(NO_FLAGS, {}, parse_config("", path)).tool_env_allow == ()


PROVIDER = '[[providers]]\nname = "p"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "P_KEY"\n'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            f'tool_env_allow = ["GOPATH", "P_KEY"]\n{PROVIDER}',
            "P_KEY holds a provider's API key, which never reaches tools",
        ),
        (
            'tool_env_allow = ["MAPLE_ACP_SOCKET"]\n',
            "MAPLE_ACP_SOCKET is a maple-acp setting; MAPLE_ACP_* never reach tools",
        ),
        ("tool_env_allow = [3]\n", "3 is not an environment variable name"),
        ('tool_env_allow = ["A-B"]\n', "'A-B' is not an environment variable name"),
        ('tool_env_allow = "PATH"\n', "must be a list of environment variable names"),
    ],
)
def test_a_bad_tool_env_allow_is_one_config_error_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "config.toml"
    with pytest.raises(ConfigFileError) as caught:
        parse_config(text, path)
    assert str(caught.value) == f"config file {path}: tool_env_allow: {problem}"


def serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, *args: str
) -> tuple[int, str]:
    """``maple-acp serve`` in-process up to its refusal (nothing listens before it)."""
    pytest.importorskip("openai", reason="the provider backend needs the openai extra")
    path = tmp_path / "config.toml"
    path.write_text(config)
    for name, value in home_env(tmp_path, FLAG_KEY="sk-flag-key-never-shown").items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, ["serve", "--config", os.fspath(path), *args])
    return result.exit_code, result.output


def test_serve_refuses_tool_env_allow_naming_the_api_key_env_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = serve(
        tmp_path,
        monkeypatch,
        'tool_env_allow = ["FLAG_KEY"]\n',
        *("--provider-url", "http://127.0.0.1:9/v1", "--model", "m"),
        *("--api-key-env", "FLAG_KEY"),
    )
    assert code == 1
    assert output == (
        f"maple-acp: config file {tmp_path / 'config.toml'}: tool_env_allow: FLAG_KEY holds a "
        "provider's API key, which never reaches tools\n"
    )


def test_serve_refuses_a_key_variable_every_tool_child_inherits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = serve(
        tmp_path,
        monkeypatch,
        "",
        *("--provider-url", "http://127.0.0.1:9/v1", "--model", "m", "--api-key-env", "LC_KEY"),
    )
    assert code == 1
    assert output == (
        "maple-acp: --api-key-env: every tool child gets LC_KEY; keep the API key in another "
        "variable\n"
    )
