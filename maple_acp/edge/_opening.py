"""Opening sessions: ``session/new``, ``session/load``, ``session/resume``, and a session's
settings (``session/list``, ``session/set_mode``, ``session/set_config_option``).

Admission rules (cwd canonicalisation, allowed roots - the runtime's and this service's own -,
relay values, task ownership) are the runtime's; this module asks the runtime for a lease and
shapes the answer. MCP definitions are validated before
anything is created. A load or resume of a session this connection already holds is a
re-attach: the request's MCP servers replace the lease's (the new set connects first), and a
load (or a resume whose dialect asks for it: v2's ``replayFrom``) replays the history again.

The connection's :class:`~maple_acp.edge._sessions.SessionTable` enforces the session cap
before anything is created or persisted, and registers the new session; the connection's
dialect shapes every answer.

Resource handling: a lease is started in the connection's nursery (its MCP servers connect in
the lease's own nursery before it is handed out). Error handling: runtime and MCP refusals
propagate (the connection maps them to JSON-RPC errors in one place). Cancellation: an open
cancelled while its lease is set up leaves nothing registered; a load's replay is cancelled
by a close of the session (its update scope).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from functools import partial

import trio

from maple_acp.edge._client import ClientChannel
from maple_acp.edge._client_tools import router_factory
from maple_acp.edge._closing import CLOSE_DEADLINE_S
from maple_acp.edge._config import AcpServiceConfig
from maple_acp.edge._dialect import (
    BooleanChange,
    Dialect,
    ImageSlot,
    Outbound,
    Projection,
    config_change,
)
from maple_acp.edge._errors import unknown_session
from maple_acp.edge._observing import SessionFollowing, attach_mode
from maple_acp.edge._prompt import mcp_definitions
from maple_acp.edge._replay import held_if
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.edge._sessions import SessionTable
from maple_acp.mcp import ValidatedServer, validate_servers
from maple_acp.model import MessageRow, TimelineItem
from maple_acp.rpc import OutboundFrameTooLarge, admitted, after_answer
from maple_acp.runtime import AgentService, RelayValues, RouterFactory, SessionLease
from maple_acp.wire import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    ListSessionsRequest,
    ListSessionsResponse,
    LoadSessionRequest,
    McpServer,
    NewSessionRequest,
    ProtocolError,
    ResumeSessionRequest,
    SessionInfo,
    SetSessionConfigOptionRequest,
    SetSessionModeRequest,
    TranscriptRequest,
    TranscriptResponse,
)

logger = logging.getLogger(__name__)


def _iso8601(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


class SessionOpener:
    """``session/new``, ``/load``, ``/resume``, ``/list`` and the session settings for one
    connection.

    Sessions start in ``nursery`` (the connection's); ``relay`` and ``dialect`` are read when
    a session opens (the bridge hello's relay values, the dialect chosen at ``initialize``);
    ``watch`` follows a new session's out-of-prompt events until its lease ends."""

    def __init__(
        self,
        table: SessionTable,
        channel: ClientChannel,
        runtime: AgentService,
        config: AcpServiceConfig,
        *,
        nursery: trio.Nursery,
        relay: Callable[[], RelayValues],
        dialect: Callable[[], Dialect],
        watch: Callable[[EdgeSession], Awaitable[None]],
        following: SessionFollowing | None = None,
    ) -> None:
        self._table = table
        self._channel = channel
        self._runtime = runtime
        #: This service's own allowed roots, which the runtime applies with its own.
        self._roots = config.allowed_roots
        self._nursery = nursery
        self._relay = relay
        self._dialect = dialect
        self._watch = watch
        #: The sessions this connection observes (another connection holds them).
        self._following = following

    async def _open(self, start: Callable[..., Awaitable[None]]) -> EdgeSession:
        table = self._table
        nursery = self._nursery
        with table.opening():
            lease: SessionLease = await nursery.start(start)
        # No checkpoint from the end of the opening to the registration: the slot passes from
        # the pending count to the table at once, and a disconnect from here on revokes it.
        session = EdgeSession(
            lease,
            self._runtime.cached_model_choices(),
            self._dialect(),
            notices=self._channel.features.notices,
            compaction=self._channel.features.compaction,
            plans=self._channel.features.plans,
            boolean_options=self._channel.features.boolean_options,
            subagents=self._channel.features.subagents,
        )
        table.register(session)
        nursery.start_soon(self._watch, session)
        # The catalog listing is cached by the runtime (one bounded discovery, then warm).
        session.choices = await lease.model_choices()
        return session

    def router_factory(self, servers: tuple[ValidatedServer, ...]) -> RouterFactory | None:
        """The lease's MCP servers, those in the client reached through this connection."""
        return router_factory(servers, self._channel)

    async def open(self, start: Callable[..., Awaitable[None]]) -> EdgeSession:
        """A session on the lease ``start`` serves (a runtime ``serve_*`` or ``fork_task``
        call), registered in the table: for the flows of other modules (``session/fork``)."""
        return await self._open(start)

    async def after_new(self, session: EdgeSession) -> None:
        """What a session created by this connection announces once its answer is queued."""
        await self._after_answer(session)

    async def new(self, request: NewSessionRequest) -> object:
        servers = validate_servers(mcp_definitions(request.mcp_servers))
        # The runtime canonicalises the cwd and the additional directories, once, and applies
        # both sets of allowed roots to each.
        session = await self._open(
            partial(
                self._runtime.serve_new_task,
                request.cwd,
                relay=self._relay(),
                router_factory=self.router_factory(servers),
                allowed_roots=self._roots,
                additional_directories=request.additional_directories,
            )
        )
        logger.info("session %s created", session.id)
        await self._after_answer(session)
        return session.dialect.new_answer(session.id, session.options(), session.settings())

    async def _attach(
        self,
        session_id: str,
        cwd: str,
        additional: tuple[str, ...],
        mcp_servers: tuple[McpServer, ...],
        *,
        resume: bool,
        observe: bool = False,
    ) -> EdgeSession:
        """A lease on the task ``session_id`` for this connection: a new one, or the one this
        connection holds already (a re-attach, when no prompt runs). A load names the
        session's additional directories; a resume names its new set (each admitted like the
        cwd), which the session keeps from then on. With ``observe``, a session another
        connection holds is followed instead (its holder keeps it)."""
        table = self._table
        if table.is_tombstoned(session_id):
            raise ProtocolError(INVALID_REQUEST, "the session is closing")
        servers = validate_servers(mcp_definitions(mcp_servers))
        held = table.get(session_id)
        if held is not None and held.closing:
            # A close admitted before this request (wire order): the client asked for the
            # session to end first, so this request waits for that end (the close's own
            # deadline bounds it; so does this wait, should the close fail) and then decides
            # as if written after its answer.
            with trio.move_on_after(CLOSE_DEADLINE_S):
                await held.wait_gone()
            held = table.get(session_id)
        if table.is_tombstoned(session_id):
            # That close missed its deadline: its cleanup goes on, and the id stays refused
            # until the connection ends.
            raise ProtocolError(INVALID_REQUEST, "the session is closing")
        if held is not None and held.observer is not None and not held.closing:
            raise ProtocolError(INVALID_REQUEST, "this connection already follows the session")
        if held is not None and not held.closing:
            return await self._reattach(held, cwd, additional, servers, resume=resume)
        if held is None and observe and self._following is not None:
            # Followed if another connection holds it; opened here if nobody does.
            followed = await self._following.attach(session_id, cwd, additional, resume=resume)
            if followed is not None:
                return followed
        if held is not None:
            raise ProtocolError(INVALID_REQUEST, "the session is closing")
        return await self._open(
            partial(
                self._runtime.serve_task,
                session_id,
                cwd,
                relay=self._relay(),
                router_factory=self.router_factory(servers),
                allowed_roots=self._roots,
                additional_directories=additional,
                replace_directories=resume,
            )
        )

    async def _reattach(
        self,
        session: EdgeSession,
        cwd: str,
        additional: tuple[str, ...],
        servers: tuple[ValidatedServer, ...],
        *,
        resume: bool,
    ) -> EdgeSession:
        # The lease holds the task already: the runtime's attach rule for its holder (the cwd
        # and the additional directories admitted under both sets of allowed roots, naming the
        # task's root and, for a load, its set of additional directories).
        admitted = await self._runtime.check_root(
            session.lease,
            cwd,
            allowed_roots=self._roots,
            additional_directories=additional,
            replace_directories=resume,
        )
        # RUN_ACTIVE (-32600) while a prompt or a goal cycle runs; if the new servers fail to
        # connect, the lease keeps its old ones (and directories) and their error is the answer.
        await session.lease.replace_router(
            self.router_factory(servers), directories=admitted if resume else None
        )
        return session

    async def load(self, request: LoadSessionRequest) -> object:
        observe = attach_mode(request.meta)
        session = await self._attach(
            request.session_id,
            request.cwd,
            request.additional_directories,
            request.mcp_servers,
            resume=False,
            observe=observe,
        )
        with self._following_if(session):
            with session.lease.operation(), session.update_scope():
                await self._replay(session)
                await self._announce(session)
            if session.stopped:
                raise unknown_session()
        logger.info("session %s loaded", session.id)
        return session.dialect.load_answer(session.options(), session.settings())

    async def _replay(self, session: EdgeSession) -> None:
        """Send the visible history (then the title), before the answer, through the live
        projector."""
        lease = session.lease
        rows: Sequence[TimelineItem | MessageRow]
        if session.observer is not None and self._following is not None:
            rows = await self._following.replay_rows(session)
        else:
            rows = await lease.replay_rows()
        if session.children.visible:
            # Each child right after the call that delegated it.
            children = await lease.children_history()
            await session.children.replay(
                self._channel,
                session.projector,
                rows,
                children,
                self._send_history,
                lease.image_data,
            )
        else:
            await self._send_history(session.id, session.projector, rows, lease.image_data)
        task = lease.task
        if task.title:
            await self._channel.send(session.id, session.projector.title(task.title))

    async def transcript(self, request: TranscriptRequest) -> TranscriptResponse:
        """``_maple/transcript``: a stored session's history sent as a load replays it, to a
        viewer (``maple-acp sessions show``) that takes no lease and needs no model: a session
        whose model left the catalog, or that another connection holds, is shown all the
        same. Only sessions this connection could list (the runtime's rule)."""
        items = await self._runtime.task_history(request.session_id, allowed_roots=self._roots)
        projector = self._dialect().projection(request.session_id)

        async def no_image(sha256: str) -> bytes | None:
            return None  # a terminal shows where an image was, not its bytes

        await self._send_history(
            request.session_id, projector, items, no_image, missing_image="not shown"
        )
        return TranscriptResponse()

    async def _send_history(
        self,
        session_id: str,
        projector: Projection,
        rows: Sequence[TimelineItem | MessageRow],
        image_data: Callable[[str], Awaitable[bytes | None]],
        *,
        missing_image: str = "no longer stored",
    ) -> None:
        """Send ``rows`` as replayed updates: runs of updates in batches, each image of a user
        message on its own once its bytes are read (one at a time: a history of many images
        never sits in memory)."""
        channel = self._channel
        updates = iter(projector.history(rows))
        slot: ImageSlot | None = None

        def until_image() -> Iterator[Outbound]:
            nonlocal slot
            for update in updates:
                if isinstance(update, ImageSlot):
                    slot = update
                    return
                yield update

        while True:
            slot = None
            await channel.send_many(session_id, until_image())
            if slot is None:
                break
            message_id, image = slot.message_id, slot.image
            data = await image_data(image.sha256)
            if data is None:
                await channel.send_many(
                    session_id, projector.image_placeholder(message_id, image, missing_image)
                )
                continue
            try:
                await channel.send(session_id, projector.image(message_id, image, data))
            except OutboundFrameTooLarge:
                await channel.send_many(
                    session_id,
                    projector.image_placeholder(message_id, image, "too large to replay"),
                )

    async def resume(self, request: ResumeSessionRequest) -> object:
        # A cursor this agent cannot serve is bad params before anything is attached.
        replay = self._dialect().replay_requested(request)
        observe = attach_mode(request.meta)
        session = await self._attach(
            request.session_id,
            request.cwd,
            request.additional_directories,
            request.mcp_servers,
            resume=True,
            observe=observe,
        )
        with self._following_if(session):
            with session.lease.operation(), session.update_scope():
                async with held_if(self._channel, session.id, replay):
                    if replay:
                        await self._replay(session)
                    await self._announce(session)
                    # The current state comes after any replay and before the answer (in a
                    # version that has one).
                    running = session.lease.active_run is not None
                    await self._channel.send_many(session.id, session.projector.attached(running))
                    if replay:
                        await self._channel.send_many(
                            session.id, session.projector.replay_complete()
                        )
            if session.stopped:
                raise unknown_session()
        logger.info("session %s resumed", session.id)
        return session.dialect.resume_answer(session.options(), session.settings())

    def _following_if(self, session: EdgeSession) -> AbstractContextManager[None]:
        """For a session this connection observes: its live updates start once the answer
        is queued, and a load or resume that fails leaves it neither attached nor held."""
        if session.observer is not None and self._following is not None:
            return self._following.attaching(session)
        return contextlib.nullcontext()

    async def _announce(self, session: EdgeSession) -> None:
        """What attaching announces (its commands, its goal), sent before a load's or a
        resume's answer: after that answer only a later request or a running turn causes
        updates (the conformance suite waits two seconds after a load's answer for silence)."""
        channel = self._channel
        goal = session.lease.goal
        if goal is not None:
            await channel.send(session.id, session.projector.goal(goal))
        commands = session.lease.commands
        if commands:
            await channel.send(session.id, session.projector.commands(commands))

    async def _after_answer(self, session: EdgeSession) -> None:
        """A new session's commands, sent once its answer is queued: a client must know the
        session id before updates about it arrive."""
        commands = session.lease.commands
        if not commands:
            return
        channel = self._channel

        async def follow() -> None:
            try:
                with session.update_scope():
                    await channel.send(session.id, session.projector.commands(commands))
            except SessionClosed:
                pass

        after_answer(follow)

    async def list(self, request: ListSessionsRequest) -> ListSessionsResponse:
        listing = await self._runtime.list_tasks(
            cwd=request.cwd, cursor=request.cursor, allowed_roots=self._roots
        )
        sessions = tuple(
            SessionInfo(
                session_id=task.id,
                cwd=task.root,
                title=task.title or None,
                updated_at=_iso8601(task.updated_ms),
                additional_directories=task.additional_directories or None,
            )
            for task in listing.tasks
        )
        return ListSessionsResponse(sessions=sessions, next_cursor=listing.next_cursor)

    async def set_mode(self, request: SetSessionModeRequest) -> object:
        session = self._table.live(request.session_id)
        # UNKNOWN_MODE (-32602) stores nothing; a change reaches the client as the lease's
        # ModeChanged event (the session-events pump announces it).
        await session.lease.set_mode(request.mode_id)
        return session.dialect.mode_answer()

    async def set_config_option(self, request: SetSessionConfigOptionRequest) -> object:
        session = self._table.live(request.session_id)
        lease = session.lease
        boolean_ids = frozenset(option.id for option in lease.boolean_options)
        change = config_change(request.config_id, request.value, boolean_ids)
        if isinstance(change, BooleanChange):
            # INVALID_OPTION (-32602) stores nothing.
            await lease.set_boolean_option(change.option_id, change.value)
        elif change.setting == "thought_level":
            # None: the backend's own default.
            await lease.set_thought_level(change.value)
        elif change.value is None:
            # Only the thought level has a "default" value; the dialect never gives another.
            raise ProtocolError(INVALID_PARAMS, f"value: expected a {change.setting} id")
        elif change.setting == "model":
            # A prompt admitted before this change decides the model lock.
            await lease.set_model(change.value, decided=admitted)
        else:
            await lease.set_mode(change.value)
        return session.dialect.config_answer(session.options())
