"""Tools for testing a host's integration (and this library) with real parts.

- ``maple_acp.testing.service``: ``running_acp`` (the host's own engine) and
  ``running_demo_acp`` (the demo backend) — a signed-in runtime over a real SQLite store with an
  ``AcpService`` on it, reached by in-memory connections;
- ``maple_acp.testing.client``: :class:`AcpTestClient` / ``open_acp_client`` — an ACP client
  over any Trio stream (memory pair, Unix socket, a connector's stdio) that records every
  frame, checks each against the schema as it arrives, answers permissions and elicitations by
  policy (``HeldPermissions``: when the test says);
- ``maple_acp.testing.invariants``: the library's promises over what clients saw
  (``AcpLedger``, ``check_frames``);
- ``maple_acp.testing.driver``: ``TrioDriver``, a Trio loop that Hypothesis's synchronous
  rules drive step by step;
- ``maple_acp.testing.schema``: the ACP JSON Schema checker (needs ``jsonschema``) and
  ``load_acp_schema``;
- ``maple_acp.testing.strategies``: Hypothesis strategies for every wire message;
- ``maple_acp.testing.demo``: a ready runtime with the demo backend over a temporary store;
- ``maple_acp.testing.store``: temporary SQLite stores and record builders;
- ``maple_acp.testing.clock``: ``VirtualTimeStore``, for deadline tests on a mock clock, and
  ``wait_quiet``.

Submodules are imported explicitly so that, for example, using the client does not need
Hypothesis installed. ``examples/host_state_machine.py`` puts them together.
"""
