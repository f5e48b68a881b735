"""maple_acp: expose a host application's own agent runtime to ACP clients.

The public names below are loaded on first use, so that importing ``maple_acp`` (as the
``maple-acp`` entry point and a host's UI do) does not pull in the whole stack::

    from maple_acp import AgentService, AcpService, SqliteTaskStore

- runtime: :class:`AgentService` and what a host supplies to it (``AgentBackend``,
  ``ModelCatalog``, ``PermissionPolicy``); its refusals, ``RuntimeRejection`` with a
  ``RejectionKind``;
- errors: :class:`MapleAcpError`, the base of every exception the library raises on purpose;
- the host process: :func:`harden_host_process` closes it to the processes it starts
  (``maple-acp serve`` calls it; a library host calls it itself);
- store: :class:`SqliteTaskStore`;
- edge: :class:`AcpService`, :class:`AcpServiceConfig`, :class:`HostLifecycle`;
- listeners, each started with ``await acp.listen(nursery, listener)``: :class:`UnixListener`
  (the owner-only socket the connector reaches) and :class:`NetworkListener` with its
  :class:`NetworkSettings` (WebSocket and Streamable HTTP; the ``http`` extra), both in the
  shape of :class:`Listener`;
- the demo backend: :class:`DemoBackend` (see ``maple_acp.backends.demo``);
- tests: ``maple_acp.testing`` (``AcpTestClient``, Hypothesis strategies, demo fixtures).
"""

from __future__ import annotations

from maple_acp_connector import __version__

# Not typing.TYPE_CHECKING, and importlib only on first use: `maple-acp --version` and
# `maple-acp acp` import this package, and typing alone costs them milliseconds. mypy treats
# any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from maple_acp._exceptions import MapleAcpError
    from maple_acp._hardening import harden_host_process
    from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
    from maple_acp.edge import AcpService, AcpServiceConfig, HostLifecycle
    from maple_acp.listeners import Listener, UnixListener
    from maple_acp.net import NetworkListener, NetworkSettings
    from maple_acp.runtime import (
        AgentBackend,
        AgentService,
        ModelCatalog,
        PermissionPolicy,
        Prompt,
        RejectionKind,
        RuntimeRejection,
        StaticModelCatalog,
    )
    from maple_acp.store import SqliteTaskStore, TaskStore

_EXPORTS = {
    "MapleAcpError": "maple_acp._exceptions",
    "harden_host_process": "maple_acp._hardening",
    "AcpService": "maple_acp.edge",
    "AcpServiceConfig": "maple_acp.edge",
    "HostLifecycle": "maple_acp.edge",
    "Listener": "maple_acp.listeners",
    "UnixListener": "maple_acp.listeners",
    "NetworkListener": "maple_acp.net",
    "NetworkSettings": "maple_acp.net",
    "AgentBackend": "maple_acp.runtime",
    "AgentService": "maple_acp.runtime",
    "ModelCatalog": "maple_acp.runtime",
    "PermissionPolicy": "maple_acp.runtime",
    "Prompt": "maple_acp.runtime",
    "RejectionKind": "maple_acp.runtime",
    "RuntimeRejection": "maple_acp.runtime",
    "StaticModelCatalog": "maple_acp.runtime",
    "SqliteTaskStore": "maple_acp.store",
    "TaskStore": "maple_acp.store",
    "DemoBackend": "maple_acp.backends.demo",
    "demo_catalog": "maple_acp.backends.demo",
    "demo_policy": "maple_acp.backends.demo",
}

__all__ = [
    "AcpService",
    "AcpServiceConfig",
    "AgentBackend",
    "AgentService",
    "DemoBackend",
    "HostLifecycle",
    "Listener",
    "MapleAcpError",
    "ModelCatalog",
    "NetworkListener",
    "NetworkSettings",
    "PermissionPolicy",
    "Prompt",
    "RejectionKind",
    "RuntimeRejection",
    "SqliteTaskStore",
    "StaticModelCatalog",
    "TaskStore",
    "UnixListener",
    "__version__",
    "demo_catalog",
    "demo_policy",
    "harden_host_process",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'maple_acp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
