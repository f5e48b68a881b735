"""Every method whose params are all optional runs when a peer leaves ``params`` out (read as
``{}``), on v1 and v2 alike; the list comes from each version's method table, so a method
added later is held to the rule too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.edge._v1 import V1Dialect
from maple_acp.edge._v2 import V2Dialect
from maple_acp.testing.schema import AcpSchema


def optional_only(dialect: V1Dialect | V2Dialect) -> list[str]:
    """The methods of ``dialect`` none of whose params is required."""
    return sorted(
        method
        for method, route in dialect.routes.items()
        if attrs.has(route.params)
        and all(field.default is not attrs.NOTHING for field in attrs.fields(route.params))
    )


def test_the_tables_name_methods_whose_params_are_all_optional() -> None:
    # The rule is only worth its test while such methods exist on both versions.
    assert "session/list" in optional_only(V1Dialect())
    assert "session/list" in optional_only(V2Dialect())


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


@pytest.mark.parametrize("version", [1, 2])
async def test_each_method_with_only_optional_params_runs_without_them(
    both: Harness, version: int, acp_schema: AcpSchema, acp_schema_v2: AcpSchema
) -> None:
    dialect = V2Dialect() if version == 2 else V1Dialect()
    methods = optional_only(dialect)
    async with both.connect() as client:
        params: dict[str, Any] = {"protocolVersion": 1, "clientCapabilities": {}}
        if version == 2:
            params = {"protocolVersion": 2, "info": {"name": "t", "version": "0"}}
            params["capabilities"] = {}
        await client.call("initialize", params)
        for number, method in enumerate(methods):
            line = {"jsonrpc": "2.0", "id": f"bare-{number}", "method": method}
            await client.send_raw(orjson.dumps(line))
        with trio.fail_after(10):
            await client.wait_until(
                lambda: all(client.answer(f"bare-{n}") is not None for n in range(len(methods)))
            )
        for number, method in enumerate(methods):
            answer = client.answer(f"bare-{number}")
            assert "result" in answer, (method, answer)
        client.validate(acp_schema_v2 if version == 2 else acp_schema)
