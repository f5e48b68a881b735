"""The host ``maple-acp serve`` and ``maple-acp demo`` run, and how it logs.

:func:`open_default_host` is the embedding recipe of ``docs/embedding.md`` with the command
line's choices: a SQLite store in the data directory, the demo engine or a configured provider,
the local OS account signed in, session deletion allowed; once it listens, each configured
provider is checked (``GET /models``, bounded) and logged in one line, and ``status`` shows
the engine (:class:`EngineReport`). Logging goes to stderr as text or as one JSON object per
line.
"""

from __future__ import annotations

import contextlib
import gc
import getpass
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs

from maple_acp.config import MAX_CONNECTIONS

logger = logging.getLogger("maple_acp.cli")

#: The store file inside the data directory.
STORE_FILE_NAME: Final = "tasks.sqlite3"
#: The installation id the command-line host gives the runtime.
INSTALLATION_ID: Final = "maple-acp"


def local_account() -> str:
    """The account the CLI host signs in: the OS user name (the uid if it has none)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = ""
    return name or f"uid-{os.getuid()}"


# -- logging ------------------------------------------------------------------------------------


def log_entry(level: str, name: str, message: str, created: float | None = None) -> dict[str, Any]:
    import time

    when = time.time() if created is None else created
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"
    return {"time": stamp, "level": level, "logger": name, "message": message}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record (``time``, ``level``, ``logger``, ``message``, and
    ``exception`` when there is one): what log collectors read line by line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = log_entry(
            record.levelname.lower(), record.name, record.getMessage(), record.created
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


#: Libraries whose INFO lines (one per HTTP request, say) are detail, not events of this host:
#: they are shown only at ``debug``.
THIRD_PARTY_LOGGERS: Final = ("httpx2", "httpcore2", "openai", "mcp")
#: The HTTP protocol libraries under the network listener: at DEBUG they log every header
#: they parse (``Authorization``, ``Cookie``), so no ``--log-level`` lets them below WARNING.
PROTOCOL_LOGGERS: Final = ("h2", "hpack", "hypercorn", "wsproto", "h11")


def configure_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("maple-acp %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    chosen = logging.getLevelName(level.upper())
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(
            chosen if chosen <= logging.DEBUG else max(chosen, logging.WARNING)
        )
    for name in PROTOCOL_LOGGERS:
        logging.getLogger(name).setLevel(max(chosen, logging.WARNING))


# -- process limits -----------------------------------------------------------------------------


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one (logged at DEBUG): a host serving the
    network must not run out of descriptors at a default soft limit of 1,024 while the system
    allows more. A limit that cannot be raised is kept."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.debug("the open-file limit stays at %d: %s", soft, exc)
        return
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    logger.debug("raised the open-file limit from %d to %s", soft, shown)


# -- the default host ---------------------------------------------------------------------------


#: Builds the host's engine inside the Trio run: ``(backend, catalog, policy)``.
EngineFactory = Callable[[], Any]


@attrs.frozen(kw_only=True)
class HostOptions:
    """Everything ``serve`` (and an embedding test) needs to run the default host."""

    endpoint: Path
    data_dir: Path
    allowed_roots: tuple[str, ...] = ()
    max_connections: int = MAX_CONNECTIONS
    #: The newest ACP version a client may get: the v2 draft unless pinned to 1.
    protocol_max: int = 2
    provisional_grace_s: float | None = None
    relay_allow: frozenset[str] = frozenset()
    #: Host variables tool children inherit beyond the built-in list (config: tool_env_allow).
    tool_env_allow: frozenset[str] = frozenset()
    #: The model child sessions run on (config: subagent_model; ``None``: their parent's).
    subagent_model: str | None = None
    account: str = attrs.field(factory=local_account)
    #: ``None``: the offline demo engine.
    engine: EngineFactory | None = None
    #: The network listener's ``maple_acp.net.NetworkSettings`` (``None``: off).
    network: Any = None


@attrs.define
class EngineReport:
    """What ``status`` shows about the engine: the backend, its default model, and each
    provider's start-up check (updated once the check answers)."""

    backend: str
    default_model: str
    providers: list[dict[str, Any]] = attrs.field(factory=list)
    #: The network listener's URL while it serves (never its token).
    http: str | None = None
    #: The file the listener reads its token from (its path only): `http-token` and the user
    #: find the one this host reads, not one a different data directory would make.
    http_token_file: str | None = None

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"backend": self.backend, "defaultModel": self.default_model}
        if self.backend == "provider":
            shown["providers"] = list(self.providers)
        if self.http is not None:
            shown["http"] = self.http
        if self.http_token_file is not None:
            shown["httpTokenFile"] = self.http_token_file
        return shown


async def check_engine(catalog: Any, report: EngineReport) -> None:
    """Check each provider once (bounded), log one line each and keep the result for
    ``status``. A provider that is down is reported, never fatal: ``serve`` keeps serving."""
    checks = await catalog.check_providers()
    report.providers = [check.as_json() for check in checks]
    for check in checks:
        logger.info("%s", check.line())


def _demo_engine() -> tuple[Any, Any, Any]:
    from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy

    return DemoBackend(), demo_catalog(), demo_policy()


def _service_config(options: HostOptions) -> Any:
    from maple_acp.edge import AcpServiceConfig

    return AcpServiceConfig(
        allowed_roots=options.allowed_roots,
        max_connections=options.max_connections,
        # `maple-acp serve` is the user's own host: deleting their sessions is theirs to decide.
        allow_session_delete=True,
        protocol_max=options.protocol_max,
    )


@asynccontextmanager
async def open_default_host(options: HostOptions) -> AsyncIterator[Any]:
    """Run the store, the runtime (signed in) and the ACP service listening on
    ``options.endpoint``; yield the :class:`~maple_acp.edge.HostLifecycle`.

    Resource handling: on exit the ACP service is stopped before the runtime is drained
    (``HostLifecycle.shutdown``), then the backend's resources (a provider's HTTP clients) and
    the store are closed; the socket file is removed. A backend that can warm up (import its
    SDK, open its clients) does so in the background once the service listens, so that
    neither the start nor the first prompt waits for it (``Backend.warm_up``: nothing for an
    engine that needs no warm-up).

    Error handling: :class:`~maple_acp.edge.ListenerError` (the endpoint is refused or
    another service answers on it) and ``maple_acp.edge.ConfigError`` propagate before
    anything listens.
    """
    import trio

    from maple_acp.backends import ProviderCatalog
    from maple_acp.edge import AcpService, HostLifecycle
    from maple_acp.listeners import UnixListener
    from maple_acp.runtime import (
        DEFAULT_PROVISIONAL_GRACE_S,
        AgentService,
        declared_backend,
        warm_up_quietly,
    )
    from maple_acp.store import SqliteTaskStore

    config = _service_config(options)
    made, catalog, policy = (options.engine or _demo_engine)()
    backend = declared_backend(made)
    probing = isinstance(catalog, ProviderCatalog)
    engine = EngineReport(
        backend="provider" if probing else "demo",
        default_model=catalog.default_model(options.account).id,
        providers=[check.as_json() for check in catalog.pending_checks()] if probing else [],
    )
    grace = options.provisional_grace_s
    store = await SqliteTaskStore.open(options.data_dir / STORE_FILE_NAME)
    async with store, contextlib.AsyncExitStack() as resources:
        # Closed after the runtime has drained every run that used it.
        await resources.enter_async_context(backend)
        runtime = AgentService(
            store=store,
            backend=backend,
            catalog=catalog,
            policy=policy,
            installation_id=INSTALLATION_ID,
            provisional_grace_s=DEFAULT_PROVISIONAL_GRACE_S if grace is None else grace,
            relay_allow_list=options.relay_allow,
            tool_env_allow=options.tool_env_allow,
            subagent_model=options.subagent_model,
            # The ACP service is this host's only surface, so its roots are the runtime's too.
            allowed_roots=options.allowed_roots,
        )
        async with runtime:
            runtime.sign_in(options.account)
            acp = AcpService(runtime, config, engine_status=engine.as_json)
            lifecycle = HostLifecycle(runtime, acp)
            async with trio.open_nursery() as nursery:
                await acp.start(nursery, UnixListener(options.endpoint))
                if options.network is not None:
                    from maple_acp.net import NetworkListener, token_path

                    # Beside the socket, in the same connection limit; acp.stop() ends both.
                    listener = NetworkListener(options.network)
                    engine.http = await acp.listen(nursery, listener)
                    engine.http_token_file = os.fspath(token_path(options.network.data_dir))
                nursery.start_soon(warm_up_quietly, backend)
                if probing:
                    # After the socket is up: a provider that is down never delays serving.
                    nursery.start_soon(check_engine, catalog, engine)
                # What start-up built lives as long as the host: out of the collector's way, so
                # the full collections that follow a mass release (thousands of objects freed
                # at once) stay short for the other connections waiting behind them.
                gc.freeze()
                try:
                    yield lifecycle
                finally:
                    with trio.CancelScope(shield=True):
                        report = await lifecycle.shutdown()
                    if not report.ok:
                        logger.error("the host did not shut down cleanly: %s", report)
                    nursery.cancel_scope.cancel()
