"""Tools for testing a host's integration (and this library) with real parts.

- ``maple_acp.testing.client``: :class:`AcpTestClient` / ``open_acp_client`` — an ACP client
  over any Trio stream (memory pair, Unix socket, a connector's stdio) that records every
  frame, answers permissions and elicitations by policy, and validates what it received;
- ``maple_acp.testing.schema``: the ACP JSON Schema checker it uses (needs ``jsonschema``);
- ``maple_acp.testing.strategies``: Hypothesis strategies for every wire message;
- ``maple_acp.testing.demo``: a ready runtime with the demo backend over a temporary store;
- ``maple_acp.testing.store``: temporary SQLite stores and record builders;
- ``maple_acp.testing.clock``: ``VirtualTimeStore``, for deadline tests on a mock clock.

Submodules are imported explicitly so that, for example, using the client does not need
Hypothesis installed.
"""
