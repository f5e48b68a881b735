"""``subagent_model`` in the config file: the model child sessions run on. Accepted and
carried to ``serve``'s settings; anything but a one-line model id is one config-error line.
The runtime's side (a child on that model) is in tests/runtime/test_children.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from maple_acp.config import ConfigFileError, parse_config, resolve_serve_settings

NO_FLAGS: dict[str, object] = {"socket": None, "data_dir": None}


def test_subagent_model_is_accepted_and_reaches_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    config = parse_config('subagent_model = "local/small"\n', path)
    assert resolve_serve_settings(NO_FLAGS, {}, config).subagent_model == "local/small"
    assert resolve_serve_settings(NO_FLAGS, {}, parse_config("", path)).subagent_model is None


@pytest.mark.parametrize("value", ['""', "3", '"a\\nb"', f'"{"m" * 201}"'])
def test_a_bad_subagent_model_is_one_config_error_line(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigFileError) as caught:
        parse_config(f"subagent_model = {value}\n", tmp_path / "config.toml")
    assert "subagent_model" in str(caught.value)
    assert "\n" not in str(caught.value)
