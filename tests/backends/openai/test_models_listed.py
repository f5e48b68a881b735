"""One model is "1 model listed", in ``doctor`` (run as the command it is, against a loopback
server listing one model) and in ``status``'s provider line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio
from loopback import LoopbackProvider, Reply

from maple_acp.cli._status_commands import _provider_line


def one_model() -> Reply:
    return Reply(body={"object": "list", "data": [{"id": "smollm2", "object": "model"}]})


async def test_doctor_says_one_model_listed(provider: LoopbackProvider, tmp_path: Path) -> None:
    provider.models = one_model()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[[providers]]\nname = "lab"\nbase_url = "{provider.base_url}"\nmodels = ["smollm2"]\n'
    )
    env = {**os.environ, "MAPLE_ACP_DATA_DIR": str(tmp_path / "data")}
    with trio.fail_after(60):
        done = await trio.run_process(
            [str(Path(sys.executable).parent / "maple-acp"), "doctor", "--config", str(config)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    output = (done.stdout + done.stderr).decode()
    assert f"{provider.base_url.removesuffix('/v1')}: reachable, 1 model listed" in output, output
    assert "models listed" not in output


def test_status_says_one_model_listed() -> None:
    line = _provider_line(
        {"name": "lab", "address": "http://127.0.0.1:1", "state": "reachable", "models": 1}
    )
    assert line == "lab at http://127.0.0.1:1: reachable, 1 model listed"
    two = _provider_line({"name": "lab", "address": "a", "state": "reachable", "models": 2})
    assert two.endswith("2 models listed")
