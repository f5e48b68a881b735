"""The soak run, short: 20 seconds of the full client mix against a real host, a share of it
over the network listener's WebSocket, without the host kill (``nox -s soak`` runs it for ten
minutes with a kill every minute)."""

from __future__ import annotations

from soak_bench import load_soak

soak = load_soak()

#: Every kind of operation the mix must have run at least once in twenty seconds.
EXERCISED = {
    "new",
    "load",
    "reload",
    "prompt",
    "tool_allow",
    "tool_reject",
    "hang_cancel",
    "close",
    "list",
    "malformed",
    "big_id",
    "cancel_idle",
}
#: Operations the mix runs when the host advertises them, or when the loopback MCP server
#: could start (else it notes the skip).
ADVERTISED = {
    "resume": "session/resume",
    "delete": "session/delete",
    "goal set": "goal",
    "mcp": "MCP",
    "mcp_cancel": "MCP",
}


async def test_short_soak_holds_every_check() -> None:
    lines: list[str] = []
    # A share of the clients over the network listener's WebSocket, killed like the others.
    # (A killed Streamable HTTP client keeps its connection for the 60 s idle bound, longer
    # than this run; nox -s soak sends that share too.)
    config = soak.SoakConfig(
        seconds=20, seed=15, kill_every_s=None, warmup_s=8, say=lines.append, network_kinds=("ws",)
    )
    report = await soak.run_soak(config)
    text = "\n".join([*lines, soak.format_report(report)])
    assert report.ok, text
    ran = {op for op, _ in report.ops}
    assert ran >= EXERCISED, text
    for op, word in ADVERTISED.items():
        skipped = any(word in note for note in report.notes)
        assert skipped or op in ran, text
    assert report.connections["opened"] >= 8, text
    assert report.connections["over ws"] > 0, text
    assert report.prompts["answered"] > 0, text
    assert report.verified_messages > 0, text
    assert [life.integrity for life in report.lives] == ["ok"], text
