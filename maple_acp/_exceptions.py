"""The root of the library's exception tree.

``MapleAcpError`` is the base of every exception the library raises on purpose; each layer
derives its own errors from it, so a host can catch everything the library means to raise with
one clause and still tell the layers apart::

    MapleAcpError
     +-- RuntimeRejection        maple_acp.runtime: a refused operation; .kind is a RejectionKind,
     |                           .message one safe line (<= 500 chars). The edge maps each kind
     |                           to one JSON-RPC code in one table.
     +-- TurnFailed              raised by a backend to end its turn as failed with a safe text
     +-- ToolUnavailable         a tool used without its router, or after revocation
     +-- FileToolError           a native file tool refused a path or a file (maple_acp.runtime)
     +-- StoreError              maple_acp.store: the task store could not do what was asked
     |    +-- InvalidCursor      a list cursor that is not one the store issued
     |    +-- ForkSourceMissing  a fork's source task, or the message it names, is not stored
     |    +-- DataDirectoryLocked
     |                           another host holds the store's data directory (its lock
     |                           file); names the directory and the holder's PID
     +-- ProtocolError           maple_acp.wire: a message that breaks the protocol; carries its
     |                           JSON-RPC code and a bounded message
     +-- WireValueError          maple_acp.wire: a field value refused while converting (also a
     |                           ValueError, which cattrs expects)
     +-- RpcError                maple_acp.rpc: the peer's own failures
     |    +-- ConnectionClosed   the connection ended before an answer or while sending
     |    +-- FrameTooLong       an inbound line over the frame limit
     |    +-- OutboundFrameTooLarge
     |                           a line we were asked to send is over the limit
     +-- ExternalMcpError        maple_acp.mcp: transient MCP servers
     |    +-- McpDefinitionError a server definition refused before anything starts
     |    +-- McpSetupError      connecting or reading a catalog failed or broke a bound
     |    +-- ExternalToolError  one external_mcp call failed
     +-- ListenerError           maple_acp.edge: the Unix socket cannot be served
     |    +-- EndpointInUse      another service already answers on it
     +-- ConfigError            maple_acp.edge: a service configuration refused (also a
     |                           ValueError)
     +-- ConfigFileError         maple_acp.config: a config file, named with its key and fault
     +-- SettingError            maple_acp.config: an environment variable serve cannot use
     +-- PrivateDirectoryError   maple_acp.config: a directory that must be private is not
     +-- ProviderConfigError     the provider layer (both model engines): a provider section
     |                           refused
     +-- ProviderUnavailable     the provider layer: an engine's optional extra is not installed
     +-- KindUnavailable         the provider layer: an engine kind that is not registered,
     |                           registered twice, or fails to load
     +-- HttpSetupError          maple_acp.net: the network listener cannot start as configured
     +-- HostUnavailable         the command line's client found no host on the socket
     +-- AcpCallError            the command line's client got an error answer
     +-- SchemaUnavailable       maple_acp.testing: the ACP schema is absent and not fetchable

Not part of the tree, on purpose, each for its reason:

- control flow inside one module, never let out of it: the edge's ``SessionClosed``, the
  provider's ``ProviderFault`` (it becomes a ``TurnFailed`` line), the command-line client's
  ``NotServed``; the network listener's ``StreamGone``, ``StreamEnded``, ``BodyTooLarge``,
  ``TokenUnavailable`` and ``MessageTooLarge`` (each becomes an HTTP status, a WebSocket close
  or the end of a response inside ``maple_acp.net``);
- the MCP router's ``ResponseTooLarge``, an ``httpx2.StreamError`` so that the HTTP transport
  treats an oversized body like any broken stream (it surfaces as ``McpSetupError`` or
  ``ExternalToolError``);
- the command line's ``CliError``, a ``click.ClickException`` so click prints it as one line and
  exits 1 (and ``click``'s own usage errors);
- the test helpers' ``SchemaViolation`` and ``InvariantViolation``, each an ``AssertionError`` so a
  test runner reports a frame that breaks the ACP schema, or a broken promise of the library,
  as a failed assertion.

The stdlib-only connector has its own small tree (``maple_acp_connector.EndpointError``) because
it must not import this package.
"""

from __future__ import annotations


class MapleAcpError(Exception):
    """Base of every exception ``maple_acp`` raises on purpose."""
