"""The MCP SDK's ERROR record for an event handed to a stream we had closed (a cancelled call)
is not an error for the host; a real failure to parse an event still is."""

from __future__ import annotations

import logging

import anyio
import pytest

import maple_acp.mcp._router  # noqa: F401  (the router, which opens MCP sessions, installs it)
from maple_acp.mcp._sdk_logs import SDK_TRANSPORT_LOGGER

SDK_LINE = "Error parsing SSE message"


def _sdk_logs(error: Exception) -> None:
    # What the SDK's transport does when handing an event on fails.
    try:
        raise error
    except Exception:
        logging.getLogger(SDK_TRANSPORT_LOGGER).exception(SDK_LINE)


@pytest.mark.parametrize(
    "error", [anyio.BrokenResourceError(), anyio.ClosedResourceError()], ids=type
)
def test_an_event_for_a_closed_stream_is_not_logged_as_an_error(
    caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    caplog.set_level(logging.INFO)
    _sdk_logs(error)
    assert [r for r in caplog.records if r.name == SDK_TRANSPORT_LOGGER] == []


def test_at_debug_the_closed_stream_record_is_kept_as_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    _sdk_logs(anyio.BrokenResourceError())
    levels = [r.levelno for r in caplog.records if r.name == SDK_TRANSPORT_LOGGER]
    assert levels == [logging.DEBUG]


def test_a_real_parse_failure_stays_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _sdk_logs(ValueError("not JSON"))
    levels = [r.levelno for r in caplog.records if r.name == SDK_TRANSPORT_LOGGER]
    assert levels == [logging.ERROR]
