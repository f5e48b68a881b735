"""What a tool child's environment holds: the host's allow-listed names, the host's
``tool_env_allow`` additions and the session's relay values; never a provider's key nor a
``MAPLE_ACP_*`` setting, with a real ``/bin/sh`` running ``env`` over a real SQLite store."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import shell_row, store_bytes

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.runtime import AgentService
from maple_acp.testing.demo import DEMO_ACCOUNT
from maple_acp.testing.store import temp_store

PROVIDER_KEY = "sk-provider-" + secrets.token_hex(12)
HOST_SETTING = "maple-setting-" + secrets.token_hex(8)
RELAYED = "relayed-" + secrets.token_hex(12)


@asynccontextmanager
async def env_service(data: Path, **options: Any) -> AsyncIterator[AgentService]:
    data.mkdir(exist_ok=True)
    async with temp_store(data) as store:
        service = AgentService(
            store=store,
            backend=DemoBackend(),
            catalog=demo_catalog(),
            policy=demo_policy(),
            relay_allow_list=("MAPLE_TOKEN",),
            **options,
        )
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service


async def test_shell_child_never_sees_the_provider_key(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_PROVIDER_KEY", PROVIDER_KEY)
    monkeypatch.setenv("MAPLE_ACP_SOMETHING", HOST_SETTING)
    monkeypatch.setenv("HOST_EXTRA", "widened-by-the-host")
    monkeypatch.setenv("LC_MAPLE_TEST", "a-locale-category")
    monkeypatch.setenv("HOME", str(tmp_path))
    before = dict(os.environ)
    data = tmp_path / "data"
    async with env_service(data, tool_env_allow=("HOST_EXTRA",)) as service:
        row = await shell_row(service, project, "env", {"MAPLE_TOKEN": RELAYED})
        stored = store_bytes(data)
    assert os.environ == before, "the host's environment was changed"
    assert row.output_text is not None
    lines = set(row.output_text.splitlines())
    assert f"PATH={os.environ['PATH']}" in lines
    assert f"HOME={tmp_path}" in lines
    assert "LC_MAPLE_TEST=a-locale-category" in lines
    assert "HOST_EXTRA=widened-by-the-host" in lines
    # The relay value reaches the child (and is redacted on the way back).
    assert "MAPLE_TOKEN=[relay:MAPLE_TOKEN]" in lines
    shown = row.output_text + json.dumps(row.raw_output)
    for absent in ("MY_PROVIDER_KEY", PROVIDER_KEY, "MAPLE_ACP_SOMETHING", HOST_SETTING):
        assert absent not in shown
        assert absent.encode() not in stored
    assert b"HOST_EXTRA=widened-by-the-host" in stored, "the row was stored"


async def test_without_tool_env_allow_a_host_variable_stays_out(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_EXTRA", "not-widened")
    async with env_service(tmp_path / "data") as service:
        row = await shell_row(
            service, project, 'echo "extra=${HOST_EXTRA-unset}"', {"MAPLE_TOKEN": RELAYED}
        )
    assert row.output_text == "extra=unset\n"


@pytest.mark.parametrize(
    "names",
    [("MAPLE_ACP_SOCKET",), ("1BAD",), ("A-B",), (3,), ("",), "PATH"],
)
async def test_tool_env_allow_refuses_what_must_never_reach_tools(
    tmp_path: Path, names: Any
) -> None:
    async with temp_store(tmp_path) as store:
        with pytest.raises(ValueError, match=r"name|setting|list") as caught:
            AgentService(
                store=store,
                backend=DemoBackend(),
                catalog=demo_catalog(),
                policy=demo_policy(),
                tool_env_allow=names,
            )
    assert "\n" not in str(caught.value)
