"""Soak run: a real ``maple-acp serve`` under a seeded random mix of ACP clients, killed with
SIGKILL and restarted on the same data directory every minute of traffic, checked for lost
messages and leaks.

    python bench/soak.py [--minutes 10 | --seconds S] [--seed N] [--workers 8] [--kill-every 60]

Eight workers each drive one connector process at a time (``maple-acp acp`` or
``maple-acp-connector``, chosen at random; a share of them, ``--network-share``, reach the host
over ``serve --http`` instead, through ``bench/net_bridge.py``: half over a WebSocket, half
over Streamable HTTP) through :class:`AcpTestClient`: new, load of any
known session, re-load on the same connection, resume, prompts (plain text, ``/stream``,
``/burst``, ``/think`` and ``/usage``, ``/tool shell`` allowed and rejected, ``/hang`` then
cancel), MCP tool calls and their cancellation through a loopback MCP server that some
sessions attach (``tests/soak/mcp_loopback.py``), cancel with nothing running, close, delete,
goal set/pause/resume/clear (``_session/goal``), list, malformed lines, a request id beyond 64
bits; a connection ends by closing its input, by SIGKILL (sometimes in the middle of a
prompt), or as a client that stops reading its output under a large stream. Operations the
host does not advertise (``initialize``: ``sessionCapabilities.resume`` / ``.delete``, goal
actions) are skipped with a printed note.

Checks, at every host restart and at the end (with the traffic paused):

- every prompt was answered exactly once, or its connection was gone before the answer;
- every user message whose prompt was answered is in its session's replay after a restart
  (``session/load``), every such session is listed, and a deleted session never returns;
- ``maple-acp status --json``: no lease and no run is left once every client has gone;
- host RSS grows by at most 16 MiB after the warm-up; open file descriptors, threads and
  child processes return to their warm-up baseline;
- the store passes ``PRAGMA integrity_check`` after each SIGKILL and at the end;
- a share of the connections' frames validates against the ACP schema;
- the host never answers ``-32603`` and never logs an error or a traceback.

Prints operations per second and every figure; exits 1 if any check failed. ``run_soak`` is
what ``nox -s soak`` and the default suite's short run (20 seconds, no kill) call.

RSS also moves with the allocator's high-water mark: the host runs with glibc's mmap threshold
fixed, and the warm-up first drives every connection's outbound buffer to its bound. To look
inside the host's own memory, run it under a wrapper: ``MAPLE_ACP_SOAK_HOST="python
wrapper.py"`` (the wrapper starts ``tracemalloc``, then calls ``maple_acp._main.main``; its
arguments are the host's).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from maple_acp.rpc import ConnectionClosed
from maple_acp.testing.client import AcpTestClient, open_acp_client
from maple_acp.testing.schema import AcpSchema, SchemaViolation, find_schema_dir
from maple_acp.wire import ProtocolError

#: Memory may grow this much over a host's life after its warm-up.
MAX_RSS_GROWTH = 16 * 1024 * 1024
#: Bounds a step that should take well under a second; a step past it is a stall (a finding).
STEP_DEADLINE_S = 30.0
#: Close and disconnect cleanup take at most 5 s (docs/protocol.md); then connectors exit.
#: Idle waits poll the host this long before calling a lease or a run stranded.
IDLE_DEADLINE_S = 20.0
#: trio's idle worker threads end after 10 s; fds, threads and children get this long to settle.
SETTLE_DEADLINE_S = 25.0
POLL_S = 0.25
#: Readings of an idle host's RSS per figure (the least counts).
RSS_SAMPLES = 4
#: glibc's allocator keeps freed large blocks in the heap once its adaptive mmap threshold has
#: risen, so RSS would follow the high-water mark of transient buffers rather than live memory.
#: The host runs with the threshold fixed (printed with the figures). Each worker thread may
#: also get an arena of its own, whose pages stay with the process: a short run whose host
#: had five threads at its baseline grew 24.9 MiB where runs with one or two grow 2-10 MiB.
#: Two arenas keep RSS about live memory whatever the thread count.
HOST_ALLOCATOR_ENV: Mapping[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": "131072",
    "MALLOC_TRIM_THRESHOLD_": "131072",
    "MALLOC_ARENA_MAX": "2",
}
#: Runs the host through this command instead of ``maple-acp`` (profiling), when set.
HOST_COMMAND_ENV = "MAPLE_ACP_SOAK_HOST"
#: Connections that share a verification after a restart.
VERIFIERS = 4
#: How often the host's RSS is sampled under traffic, for the printed trend.
RSS_EVERY_S = 10.0
#: Error codes refusals carry (docs/protocol.md: bad params, state conflict, unknown session,
#: unknown method, parse error, cancelled request); anything else, -32603 included, is a finding.
EXPECTED_CODES = frozenset({-32700, -32600, -32601, -32602, -32002, -32800})
#: A connection runs this many operations before it ends (one of the ways below).
OPS_PER_CONNECTION = (4, 30)
#: Share of the sessions opened (new, load, resume) with the loopback MCP server.
MCP_SHARE = 0.15
#: The loopback MCP server's name in ``mcpServers``; its tools are ``MCP_NAME__<tool>``.
MCP_NAME = "soak"
MCP_SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "soak" / "mcp_loopback.py"
#: The stdio client of the network listener that stands where a connector stands.
NET_BRIDGE = os.fspath(Path(__file__).resolve().parent / "net_bridge.py")
#: A killed Streamable HTTP client's connection ends at the listener's idle bound (60 s).
HTTP_IDLE_DEADLINE_S = 80.0
#: Weights of the operations a worker picks from while its connection is open.
OPERATIONS: Mapping[str, int] = {
    "new": 6,
    "load": 8,
    "reload": 4,
    "resume": 4,
    "prompt": 28,
    "tool_allow": 6,
    "tool_reject": 6,
    "hang_cancel": 6,
    "mcp": 4,
    "mcp_cancel": 2,
    "close": 6,
    "cancel_idle": 2,
    "delete": 4,
    "goal": 6,
    "list": 3,
    "malformed": 4,
    "big_id": 1,
}
#: How a connection ends, by weight.
ENDINGS: Mapping[str, int] = {"close_input": 60, "kill": 20, "kill_mid_prompt": 12, "stall": 8}
MALFORMED_LINES = (
    (b"this is not json", None),
    (b"\xff\xfe\x00 not utf-8", None),
    (b"[]", None),
    (b'{"jsonrpc":"2.0","id":2.5,"method":"session/list","params":{}}', None),
    (b'{"jsonrpc":"2.0","id":"bad-params","method":"session/prompt","params":[]}', "bad-params"),
    (b'{"jsonrpc":"2.0","id":"bad-method","method":"session/fork","params":{}}', "bad-method"),
    (
        b'{"jsonrpc":"2.0","id":"bad-blank","method":"session/prompt",'
        b'"params":{"sessionId":"   ","prompt":[{"type":"text","text":"x"}]}}',
        "bad-blank",
    ),
    (b'{"jsonrpc":"2.0","id":"bad-type","method":"session/new","params":{"cwd":7}}', "bad-type"),
)
GOAL_OBJECTIVES = ("soak goal complete after 2", "soak goal hang", "soak goal block")


# --- configuration and results --------------------------------------------------------------


@dataclass
class SoakConfig:
    seconds: float = 600.0
    seed: int = 1
    workers: int = 8
    #: A host SIGKILL and restart this often; ``None`` never kills.
    kill_every_s: float | None = 60.0
    #: Traffic before the first baseline of each host life.
    warmup_s: float = 15.0
    #: Extra environment for every process (e.g. ``PYTHONPATH`` of a source snapshot).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Append the host's whole stderr (every life) to this file.
    host_log: Path | None = None
    #: Every frame of this share of connections is checked against the ACP schema (costly).
    validate_share: float = 0.05
    #: This share of connections goes over the network listener (half WebSocket, half
    #: Streamable HTTP) instead of a connector; 0 leaves the listener off.
    network_share: float = 0.25
    #: The network transports that share uses. A Streamable HTTP client that dies (killed by
    #: the mix, or when traffic pauses) keeps its connection until the listener's idle bound
    #: (60 s) ends it, and idle checks then wait that long.
    network_kinds: tuple[str, ...] = ("ws", "http")
    #: Whether the mix may kill a Streamable HTTP client (else it closes its input).
    http_kills: bool = True
    say: Callable[[str], None] = print


@dataclass
class Sample:
    rss: int
    fds: int
    threads: int
    children: int

    def describe(self) -> str:
        return (
            f"rss {self.rss / 2**20:.1f} MiB, fds {self.fds}, threads {self.threads}, "
            f"children {self.children}"
        )


@dataclass
class HostLife:
    pid: int
    started: float
    baseline: Sample | None = None
    final: Sample | None = None
    end: str = ""
    integrity: str = ""


@dataclass
class Ledger:
    """What the clients know happened, to check the host against."""

    cwd: dict[str, str] = field(default_factory=dict)
    admitted: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    deleted: set[str] = field(default_factory=set)
    maybe_deleted: set[str] = field(default_factory=set)
    dirty: set[str] = field(default_factory=set)


@dataclass
class SoakReport:
    config: SoakConfig
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ops: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    connections: collections.Counter[str] = field(default_factory=collections.Counter)
    prompts: collections.Counter[str] = field(default_factory=collections.Counter)
    lives: list[HostLife] = field(default_factory=list)
    verified_sessions: int = 0
    verified_messages: int = 0
    verified_deleted: int = 0
    validated_frames: int = 0
    traffic_s: float = 0.0
    elapsed_s: float = 0.0
    #: (seconds since start, host RSS bytes) under traffic.
    rss_trend: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    def find(self, text: str) -> None:
        if text not in self.findings:
            self.findings.append(text)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            self.config.say(f"note: {text}")


# --- processes --------------------------------------------------------------------------------


def _commands() -> tuple[list[str], list[list[str]]]:
    """``maple-acp serve`` and the two connector commands, as installed beside this Python."""
    bindir = Path(sys.executable).parent
    main = bindir / "maple-acp"
    connector = bindir / "maple-acp-connector"
    host = [str(main)] if main.exists() else [sys.executable, "-m", "maple_acp._main"]
    connectors = [[*host, "acp"]]
    if os.environ.get(HOST_COMMAND_ENV):
        # A wrapper around the host, e.g. a memory profiler: its arguments follow.
        host = shlex.split(os.environ[HOST_COMMAND_ENV])
    connectors.append(
        [str(connector)] if connector.exists() else [sys.executable, "-m", "maple_acp_connector"]
    )
    return host, connectors


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAPLE_ACP_SOCKET", "MAPLE_ACP_RELAY_ENV")
    }
    env.update(extra)
    return env


def sample_process(pid: int) -> Sample:
    """RSS, open fds, threads and live descendants of ``pid``, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss = int(fields["VmRSS"].split()[0]) * 1024
    threads = int(fields["Threads"])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after the last ')'.
        # Zombies count too: a child nobody reaped is a leak.
        rest = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry)] = int(rest[1])
    descendants = 0
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        descendants += len(frontier)
    return Sample(rss=rss, fds=fds, threads=threads, children=descendants)


def integrity_check(data_dir: Path) -> str:
    """``PRAGMA integrity_check`` of a copy of every store file (the WAL is recovered on open)."""
    stores = sorted(data_dir.glob("*.sqlite3"))
    if not stores:
        return "no store file"
    results = []
    with tempfile.TemporaryDirectory(prefix="soak-db-") as scratch:
        for store in stores:
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{store}{suffix}")
                if source.exists():
                    shutil.copyfile(source, Path(scratch) / f"{store.name}{suffix}")
            connection = sqlite3.connect(Path(scratch) / store.name)
            try:
                rows = connection.execute("PRAGMA integrity_check").fetchall()
            finally:
                connection.close()
            results.append(", ".join(str(row[0]) for row in rows))
    return "; ".join(results)


class StderrTail:
    """Keeps a process's last stderr lines and counts the ones that report a defect."""

    def __init__(self, keep: int = 40, log: Path | None = None) -> None:
        self.log = log
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.defects: list[str] = []
        self.ready = trio.Event()
        self.closed = trio.Event()

    async def pump(self, stream: trio.abc.ReceiveStream, ready_prefix: str | None) -> None:
        pending = b""
        try:
            while data := await stream.receive_some(65536):
                *complete, pending = (pending + data).split(b"\n")
                if self.log is not None and complete:
                    with self.log.open("ab") as log:
                        log.write(b"".join(raw + b"\n" for raw in complete))
                for raw in complete:
                    line = raw.decode(errors="replace")
                    self.lines.append(line)
                    # A traceback, or an error: nothing this traffic does is an error of the
                    # host's (a client going away never reads like one).
                    if "Traceback" in line or " ERROR " in line or " CRITICAL " in line:
                        self.defects.append(line)
                    if ready_prefix is not None and line.startswith(ready_prefix):
                        self.ready.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed.set()


class Host:
    """One life of ``maple-acp serve`` on the soak's socket and data directory."""

    READY = "maple-acp: serving on "

    def __init__(
        self,
        command: list[str],
        socket: Path,
        data_dir: Path,
        env: dict[str, str],
        log: Path | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.log = log
        self.command = [
            *command,
            "serve",
            "--socket",
            os.fspath(socket),
            "--data-dir",
            os.fspath(data_dir),
            "--log-level",
            "warning",
            *(extra or []),
        ]
        self.socket = socket
        self.data_dir = data_dir
        self.env = env
        self.process: trio.Process | None = None
        self.stderr = StderrTail()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self, nursery: trio.Nursery) -> None:
        self.stderr = StderrTail(log=self.log)
        self.process = await nursery.start(
            partial(
                trio.run_process,
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
                env=self.env,
            )
        )
        assert self.process.stderr is not None
        nursery.start_soon(self.stderr.pump, self.process.stderr, self.READY)
        with trio.move_on_after(60):
            await self.stderr.ready.wait()
        if not self.stderr.ready.is_set():
            raise RuntimeError(f"the host did not start: {list(self.stderr.lines)}")

    async def kill(self) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        await self.stderr.closed.wait()

    async def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STEP_DEADLINE_S):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
            return -1
        await self.stderr.closed.wait()
        return self.process.returncode

    async def status(self) -> dict[str, Any] | None:
        """``maple-acp status --json``, or ``None`` when it could not get an answer."""
        command = [*self.command[: self.command.index("serve")], "status", "--json"]
        result = await trio.run_process(
            [*command, "--socket", os.fspath(self.socket)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=self.env,
        )
        if result.returncode != 0:
            return None
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer


@asynccontextmanager
async def connector(
    command: list[str], socket: Path, env: dict[str, str]
) -> AsyncIterator[trio.Process]:
    """A connector subprocess; killed if still running when the block ends."""
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [*command, "--socket", os.fspath(socket)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                check=False,
                env=env,
            )
        )
        try:
            yield process
        finally:
            with trio.move_on_after(5) as waited:
                waited.shield = True
                await process.wait()
            if process.returncode is None:
                process.kill()


# --- one client connection ------------------------------------------------------------------


class SoakAborted(Exception):
    """The run cannot go on (the host died on its own, a verification could not connect)."""


class Gone(Exception):
    """The connection ended under a step (the host went away or refused us)."""


@dataclass
class Capabilities:
    resume: bool = False
    delete: bool = False
    goal_actions: tuple[str, ...] = ()


def capabilities_of(answer: Mapping[str, Any]) -> Capabilities:
    agent = answer.get("agentCapabilities") or {}
    sessions = agent.get("sessionCapabilities") or {}
    goal = (answer.get("_meta") or agent.get("_meta") or {}).get("goal") or {}
    return Capabilities(
        resume=sessions.get("resume") is not None,
        delete=sessions.get("delete") is not None,
        goal_actions=tuple(goal.get("actions") or ()),
    )


class Connection:
    """One worker's client on one connector, and the operations it can run."""

    def __init__(
        self, worker: Worker, client: AcpTestClient, process: trio.Process, caps: Capabilities
    ) -> None:
        self.worker = worker
        self.client = client
        self.process = process
        self.caps = caps
        self.owned: list[str] = []
        #: Owned sessions whose lease holds the loopback MCP server.
        self.with_mcp: set[str] = set()
        #: Until the connection ends by closing its input, an unanswered prompt is excused.
        self.gone = True
        #: How it reaches the host: "socket" (a connector), "ws" or "http" (the bridge).
        self.transport = "socket"

    @property
    def report(self) -> SoakReport:
        return self.worker.report

    @property
    def ledger(self) -> Ledger:
        return self.worker.ledger

    async def call(self, op: str, method: str, params: Any) -> Any:
        """One request; refusals are counted and returned as ``ProtocolError``."""
        try:
            with trio.fail_after(STEP_DEADLINE_S):
                return await self.client.call(method, params)
        except ProtocolError as error:
            if error.code not in EXPECTED_CODES:
                self.report.find(f"{method} answered {error.code}: {error.message}")
            return error
        except trio.TooSlowError:
            self.report.find(f"{method} took longer than {STEP_DEADLINE_S:.0f} s ({op})")
            raise Gone from None
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            raise Gone from None

    def count(self, op: str, answer: Any) -> None:
        outcome = f"error {answer.code}" if isinstance(answer, ProtocolError) else "ok"
        self.report.ops[(op, outcome)] += 1

    def _pick_known(self) -> str | None:
        known = [s for s in self.ledger.cwd if s not in self.ledger.deleted]
        return self.worker.rng.choice(known) if known else None

    # -- sessions ---------------------------------------------------------------------------

    def _servers(self, share: float) -> list[dict[str, Any]]:
        """The loopback MCP server for ``share`` of the sessions opened (when it runs)."""
        definition = self.worker.soak.mcp_definition
        if definition is None or self.worker.rng.random() >= share:
            return []
        return [definition]

    async def new(self, *, servers: list[dict[str, Any]] | None = None) -> None:
        cwd = self.worker.rng.choice(self.worker.projects)
        servers = self._servers(MCP_SHARE) if servers is None else servers
        answer = await self.call("new", "session/new", {"cwd": cwd, "mcpServers": servers})
        self.count("new", answer)
        if isinstance(answer, ProtocolError):
            return
        session_id = answer["sessionId"]
        self.ledger.cwd[session_id] = cwd
        self.owned.append(session_id)
        if servers:
            self.with_mcp.add(session_id)

    async def load(self, *, method: str = "session/load", same: bool = False) -> None:
        op = {"session/load": "reload" if same else "load", "session/resume": "resume"}[method]
        if same:
            if not self.owned:
                return await self.new()
            session_id: str | None = self.worker.rng.choice(self.owned)
        else:
            session_id = self._pick_known()
        if session_id is None:
            return await self.new()
        servers = self._servers(MCP_SHARE)
        params = {
            "sessionId": session_id,
            "cwd": self.ledger.cwd[session_id],
            "mcpServers": servers,
        }
        answer = await self.call(op, method, params)
        self.count(op, answer)
        if isinstance(answer, ProtocolError):
            return
        if session_id not in self.owned:
            self.owned.append(session_id)
        # A (re-)attach replaces the session's servers with the request's.
        if servers:
            self.with_mcp.add(session_id)
        else:
            self.with_mcp.discard(session_id)
        if method == "session/load":
            self._check_replay(session_id)

    def _check_replay(self, session_id: str) -> None:
        """The replay just received holds every message admitted in this session so far."""
        replayed = "".join(
            update["content"].get("text", "")
            for update in self.client.updates(session_id)
            if update.get("sessionUpdate") == "user_message_chunk"
        )
        for marker in self.ledger.admitted.get(session_id, ()):
            if marker not in replayed:
                self.report.find(f"session/load of {session_id} did not replay {marker!r}")

    async def resume(self) -> None:
        if not self.caps.resume:
            self.report.note("session/resume is not advertised: resume operations skipped")
            return await self.load()
        await self.load(method="session/resume")

    async def cancel_idle(self) -> None:
        """``session/cancel`` with no prompt running, or for an unknown session: a silent
        no-op; the connection stays usable (checked by listing)."""
        rng = self.worker.rng
        session_id = rng.choice(self.owned) if self.owned and rng.random() < 0.7 else "no-such"
        try:
            await self.client.cancel(session_id)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            raise Gone from None
        answer = await self.call("cancel_idle", "session/list", {})
        self.count("cancel_idle", answer)

    async def close(self) -> None:
        if not self.owned:
            return
        session_id = self.owned.pop(self.worker.rng.randrange(len(self.owned)))
        self.with_mcp.discard(session_id)
        answer = await self.call("close", "session/close", {"sessionId": session_id})
        self.count("close", answer)
        if isinstance(answer, ProtocolError) and answer.code != -32002:
            self.report.find(f"session/close refused: {answer.code} {answer.message}")

    async def delete(self) -> None:
        if not self.caps.delete:
            self.report.note("session/delete is not advertised: delete operations skipped")
            return await self.close()
        rng = self.worker.rng
        session_id = rng.choice(self.owned) if self.owned and rng.random() < 0.5 else None
        session_id = session_id or self._pick_known()
        if session_id is None:
            return
        self.ledger.maybe_deleted.add(session_id)
        answer = await self.call("delete", "session/delete", {"sessionId": session_id})
        self.count("delete", answer)
        if not isinstance(answer, ProtocolError):
            self.ledger.deleted.add(session_id)
            self.ledger.maybe_deleted.discard(session_id)
            if session_id in self.owned:
                self.owned.remove(session_id)
            self.with_mcp.discard(session_id)
        elif answer.code in (-32600, -32002):
            # Refused: the task is what it was.
            self.ledger.maybe_deleted.discard(session_id)

    async def goal(self) -> None:
        if not self.caps.goal_actions:
            self.report.note("no goal actions are advertised: goal operations skipped")
            return
        if not self.owned:
            return await self.new()
        rng = self.worker.rng
        action = rng.choice(self.caps.goal_actions)
        params: dict[str, Any] = {"sessionId": rng.choice(self.owned), "action": action}
        if action == "set":
            params["objective"] = rng.choice(GOAL_OBJECTIVES)
        answer = await self.call("goal", "_session/goal", params)
        self.count(f"goal {action}", answer)

    async def list(self) -> None:
        answer = await self.call("list", "session/list", {})
        self.count("list", answer)

    # -- prompts ----------------------------------------------------------------------------

    async def prompt(self, kind: str) -> None:
        rng = self.worker.rng
        if kind in ("mcp", "mcp_cancel"):
            if self.worker.soak.mcp_definition is None:
                self.report.note("the loopback MCP server is not running: MCP calls skipped")
                return
            if not self.with_mcp:
                # Open one first, then run the operation picked on it: returning here made
                # an MCP call depend on a second lucky draw (a short run could miss it).
                await self.new(servers=self._servers(1.0))
                if not self.with_mcp:
                    return
            session_id = rng.choice(sorted(self.with_mcp))
        elif not self.owned:
            return await self.new()
        else:
            session_id = rng.choice(self.owned)
        marker = self.worker.marker()
        if kind == "prompt":
            body = rng.choice(
                [
                    f"/echo hello {marker}",
                    f"/stream {rng.randint(1, 20)} {rng.randint(16, 512)}",
                    "/think pondering\n/usage 10 20",
                    "plain words\n/title soak",
                    f"/burst {rng.randint(300, 600)} 64",
                ]
            )
            if rng.random() < 0.02:
                body = "/stream 200 2048"
        elif kind in ("tool_allow", "tool_reject"):
            word = kind.removeprefix("tool_")
            body = f'/tool shell {{"command": "echo {word} {marker}"}}'
        elif kind == "mcp":
            body = f'/mcp {MCP_NAME}__echo {{"text": "{marker}"}}'
        elif kind == "mcp_cancel":
            body = f"/echo started {marker}\n/mcp {MCP_NAME}__slow {{}}"
        else:
            body = f"/echo started {marker}\n/hang"
        text = f"{marker}\n{body}"
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        self.report.prompts["sent"] += 1
        if kind in ("hang_cancel", "mcp_cancel"):
            answer = await self._hang_then_cancel(session_id, marker, params)
        else:
            answer = await self.call(kind, "session/prompt", params)
        self.count(kind, answer)
        if isinstance(answer, ProtocolError):
            return
        self.ledger.admitted[session_id].append(marker)
        self.ledger.dirty.add(session_id)
        stop = answer.get("stopReason")
        expected = "cancelled" if kind in ("hang_cancel", "mcp_cancel") else None
        if expected is not None and stop != expected:
            self.report.find(f"a cancelled /hang answered stopReason {stop!r}")
        if kind in ("tool_allow", "tool_reject", "mcp"):
            self._check_tool(session_id, marker, allowed=kind != "tool_reject")

    async def _hang_then_cancel(self, session_id: str, marker: str, params: Any) -> Any:
        answer: Any = None
        lost = False

        async def prompt() -> None:
            nonlocal answer, lost
            try:
                answer = await self.call("cancelled prompt", "session/prompt", params)
            except Gone:
                lost = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prompt)
            with trio.move_on_after(STEP_DEADLINE_S):
                await self.client.wait_until(
                    lambda: (
                        answer is not None or f"started {marker}" in self.client.text(session_id)
                    )
                )
            if answer is None and not lost:
                try:
                    await self.client.cancel(session_id)
                except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                    lost = True
        if lost:
            raise Gone
        return answer

    def _check_tool(self, session_id: str, marker: str, *, allowed: bool) -> None:
        statuses = {
            update.get("status")
            for update in self.client.updates(session_id)
            if update.get("sessionUpdate") in ("tool_call", "tool_call_update")
            and marker in json.dumps(update)
        }
        wanted = "completed" if allowed else "failed"
        if wanted not in statuses:
            self.report.find(
                f"a shell tool {'allowed' if allowed else 'rejected'} ended {statuses}"
            )

    # -- malformed input --------------------------------------------------------------------

    async def big_id(self) -> None:
        """A request id beyond 64 bits comes back with the very digits it was sent with."""
        request_id = str(2**64 + self.worker.rng.randrange(2**40))
        line = f'{{"jsonrpc":"2.0","id":{request_id},"method":"session/list","params":{{}}}}'
        echoed = f'"id":{request_id}'.encode()

        def answered() -> bool:
            return any(
                frame.direction == "in" and echoed in frame.raw for frame in self.client.frames
            )

        try:
            await self.client.send_raw(line.encode())
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            raise Gone from None
        with trio.move_on_after(STEP_DEADLINE_S):
            await self.client.wait_until(answered)
        if not answered():
            self.report.find(f"no answer echoing the request id {request_id}")
        self.report.ops[("big_id", "ok" if answered() else "unanswered")] += 1

    async def malformed(self) -> None:
        if self.transport == "http":
            # Streamable HTTP refuses a body that is not one JSON-RPC message at the transport
            # (400, 501), before any connection sees it: there is no JSON-RPC answer to await.
            answer = await self.call("malformed", "session/list", {})
            self.count("malformed", answer)
            return
        line, reply_id = self.worker.rng.choice(MALFORMED_LINES)
        if reply_id is not None:
            # Each malformed request gets an id of its own, so its answer is told apart.
            unique = f"{reply_id}-{self.worker.marker()}"
            line = line.replace(f'"{reply_id}"'.encode(), f'"{unique}"'.encode())
            reply_id = unique

        def answers() -> int:
            return sum(
                1
                for frame in self.client.frames
                if frame.direction == "in"
                and isinstance(frame.message, dict)
                and "error" in frame.message
                and frame.message.get("id") == reply_id
            )

        before = answers()
        try:
            await self.client.send_raw(line)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            raise Gone from None
        with trio.move_on_after(STEP_DEADLINE_S):
            await self.client.wait_until(lambda: answers() > before)
        if answers() == before:
            self.report.find(f"no error answer to a malformed line {line[:40]!r}")
        # The connection must still be usable.
        answer = await self.call("malformed", "session/list", {})
        self.count("malformed", answer)

    # -- the whole connection ---------------------------------------------------------------

    async def run(self, steps: int) -> None:
        rng = self.worker.rng
        names = list(OPERATIONS)
        weights = [OPERATIONS[name] for name in names]
        for _ in range(steps):
            op = rng.choices(names, weights)[0]
            if op == "new":
                await self.new()
            elif op == "load":
                await self.load()
            elif op == "reload":
                await self.load(same=True)
            elif op == "resume":
                await self.resume()
            elif op in ("prompt", "tool_allow", "tool_reject", "hang_cancel", "mcp", "mcp_cancel"):
                await self.prompt(op)
            elif op == "close":
                await self.close()
            elif op == "cancel_idle":
                await self.cancel_idle()
            elif op == "delete":
                await self.delete()
            elif op == "goal":
                await self.goal()
            elif op == "list":
                await self.list()
            elif op == "big_id":
                await self.big_id()
            else:
                await self.malformed()

    def account_prompts(self) -> None:
        """Every prompt answered exactly once, or its connection gone."""
        asked = {
            frame.message["id"]
            for frame in self.client.frames
            if frame.direction == "out"
            and isinstance(frame.message, dict)
            and frame.message.get("method") == "session/prompt"
            # Malformed lines sent on purpose carry string ids; this client's own are integers.
            and type(frame.message.get("id")) is int
        }
        answers = collections.Counter(
            frame.message.get("id")
            for frame in self.client.frames
            if frame.direction == "in"
            and isinstance(frame.message, dict)
            and "method" not in frame.message
            and frame.message.get("id") in asked
        )
        for request_id in asked:
            count = answers[request_id]
            if count > 1:
                frames = [
                    frame.raw[:200]
                    for frame in self.client.frames
                    if isinstance(frame.message, dict) and frame.message.get("id") == request_id
                ]
                self.report.find(f"a prompt was answered {count} times: {frames}")
            elif count == 1:
                self.report.prompts["answered"] += 1
            elif self.gone:
                self.report.prompts["connection gone"] += 1
            else:
                self.report.find("a prompt went unanswered on a live connection")


class Worker:
    """One of the eight simulated clients: connection after connection until cancelled."""

    def __init__(self, index: int, soak: Soak) -> None:
        self.index = index
        self.soak = soak
        self.rng = random.Random(soak.config.seed * 1000 + index)
        self.counter = 0

    @property
    def report(self) -> SoakReport:
        return self.soak.report

    @property
    def ledger(self) -> Ledger:
        return self.soak.ledger

    @property
    def projects(self) -> list[str]:
        return self.soak.projects

    def marker(self) -> str:
        self.counter += 1
        return f"soak-{self.soak.config.seed}-{self.index}-{self.counter}"

    def permission(self, params: Mapping[str, Any]) -> str:
        # The command says what the client answers: "echo allow ..." or "echo reject ...".
        return "reject" if "reject" in json.dumps(params.get("toolCall", {})) else "allow"

    async def run(self) -> None:
        while True:
            ending = self.rng.choices(list(ENDINGS), list(ENDINGS.values()))[0]
            if ending == "stall":
                await self.stalled_reader()
            else:
                await self.connection(ending)

    def client_command(self) -> tuple[str, list[str]]:
        """How this connection reaches the host: ("socket", a connector) or a network
        transport ("ws", "http") and its bridge."""
        network = self.soak.network_commands
        if network and self.rng.random() < self.soak.config.network_share:
            kind = self.rng.choice(sorted(network))
            return kind, network[kind]
        return "socket", self.rng.choice(self.soak.connector_commands)

    async def connection(self, ending: str) -> None:
        transport, command = self.client_command()
        if transport == "http" and ending != "close_input" and not self.soak.config.http_kills:
            ending = "close_input"
        self.report.connections[f"over {transport}"] += 1
        self.process: trio.Process | None = None
        try:
            await self._connection(transport, command, ending)
        finally:
            process = self.process
            if transport == "http" and process is not None and (process.returncode or -1) < 0:
                # Killed (by the mix or for hanging): a client gone without a word keeps its
                # Streamable HTTP connection until the listener's idle bound.
                self.soak.http_killed = True

    async def _connection(self, transport: str, command: list[str], ending: str) -> None:
        async with connector(command, self.soak.socket, self.soak.env) as process:
            self.process = process
            assert process.stdin is not None
            assert process.stdout is not None
            stream = trio.StapledStream(process.stdin, process.stdout)
            conn: Connection | None = None
            try:
                async with open_acp_client(stream, permission=self.permission) as client:
                    try:
                        with trio.fail_after(STEP_DEADLINE_S):
                            answer = await client.initialize()
                    except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                        # Turned away (the host is at its connection limit, or restarting).
                        self.report.connections["refused or host away"] += 1
                        await trio.sleep(self.rng.uniform(0.1, 0.5))
                        return
                    conn = Connection(self, client, process, capabilities_of(answer))
                    conn.transport = transport
                    self.report.connections["opened"] += 1
                    await conn.run(self.rng.randint(*OPS_PER_CONNECTION))
                    await self._end(conn, ending)
            except* (Gone, ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                self.report.connections["ended by the host"] += 1
            finally:
                if conn is not None:
                    conn.account_prompts()
                    if self.rng.random() < self.soak.config.validate_share:
                        self.soak.validate(conn.client)

    async def _end(self, conn: Connection, ending: str) -> None:
        self.report.connections[ending] += 1
        if ending == "close_input":
            # Every prompt of this connection was awaited: none may be left unanswered.
            conn.gone = False
            return
        if ending == "kill_mid_prompt" and conn.owned:
            session_id = self.rng.choice(conn.owned)
            body = self.rng.choice(
                ["/hang", "/stream 2000 1024", '/tool shell {"command": "sleep 30"}']
            )
            params = {"sessionId": session_id, "prompt": [{"type": "text", "text": body}]}
            self.report.prompts["sent"] += 1
            with trio.move_on_after(self.rng.uniform(0.05, 0.5)):
                with suppress(ProtocolError, ConnectionClosed, trio.BrokenResourceError):
                    await conn.client.call("session/prompt", params)
        conn.process.kill()

    async def stalled_reader(self) -> None:
        """A client that starts a large stream and then stops reading, until it is killed."""
        command = self.rng.choice(self.soak.connector_commands)
        cwd = self.rng.choice(self.projects)
        async with connector(command, self.soak.socket, self.soak.env) as process:
            assert process.stdin is not None
            assert process.stdout is not None
            lines = [
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                },
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "session/new",
                    "params": {"cwd": cwd, "mcpServers": []},
                },
            ]
            try:
                for line in lines:
                    await process.stdin.send_all(json.dumps(line).encode() + b"\n")
                session_id = await self._read_new_session(process.stdout)
                if session_id is None:
                    self.report.connections["refused or host away"] += 1
                    return
                self.ledger.cwd[session_id] = cwd
                self.report.connections["opened"] += 1
                self.report.connections["stall"] += 1
                prompt = {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "session/prompt",
                    "params": {
                        "sessionId": session_id,
                        "prompt": [{"type": "text", "text": "/stream 20000 4096"}],
                    },
                }
                self.report.prompts["sent"] += 1
                self.report.prompts["connection gone"] += 1
                await process.stdin.send_all(json.dumps(prompt).encode() + b"\n")
                await trio.sleep(self.rng.uniform(2, 6))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.report.connections["refused or host away"] += 1
            finally:
                process.kill()

    async def _read_new_session(self, stdout: trio.abc.ReceiveStream) -> str | None:
        buffer = b""
        with trio.move_on_after(STEP_DEADLINE_S):
            while data := await stdout.receive_some(65536):
                buffer += data
                for line in buffer.split(b"\n")[:-1]:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        self.report.find(
                            f"the connector wrote a line that is not JSON: {line[:80]!r}"
                        )
                        continue
                    if isinstance(message, dict) and message.get("id") == 2:
                        return str(message["result"]["sessionId"]) if "result" in message else None
            return None
        self.report.find("session/new took too long on a fresh connection")
        return None


# --- the run ----------------------------------------------------------------------------------


class Soak:
    def __init__(self, config: SoakConfig, directory: Path) -> None:
        self.config = config
        self.report = SoakReport(config)
        self.ledger = Ledger()
        self.directory = directory
        self.socket = directory / "run" / "acp.sock"
        self.data_dir = directory / "data"
        self.env = _environment(config.env)
        self.host_env = {**HOST_ALLOCATOR_ENV, **self.env}
        host_command, self.connector_commands = _commands()
        extra: list[str] = []
        #: Commands of network clients by transport ("ws", "http"), when the listener is on.
        self.network_commands: dict[str, list[str]] = {}
        if config.network_share > 0:
            # One port for every life of the host, so that clients find it after a restart.
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            extra = ["--http", f"127.0.0.1:{port}"]
            url = f"http://127.0.0.1:{port}/acp"
            token = os.fspath(self.data_dir / "http-token")
            for kind in config.network_kinds:
                self.network_commands[kind] = [sys.executable, NET_BRIDGE, kind, url, token]
        self.host = Host(
            host_command, self.socket, self.data_dir, self.host_env, config.host_log, extra
        )
        #: Whether a Streamable HTTP client was killed in this host life (see http_kills).
        self.http_killed = False
        self.projects = []
        for index in range(4):
            project = directory / f"project{index}"
            project.mkdir()
            self.projects.append(os.fspath(project))
        (directory / "run").mkdir(mode=0o700)
        # One worker object per slot for the whole run: its random stream and its markers go on
        # across pauses and restarts.
        self.workers = [Worker(index, self) for index in range(config.workers)]
        directory_of_schema = find_schema_dir()
        self.schema = AcpSchema(directory_of_schema) if directory_of_schema else None

    def say(self, text: str) -> None:
        self.config.say(text)

    def validate(self, client: AcpTestClient) -> None:
        """Every frame the host sent on this connection, against the ACP schema."""
        if self.schema is None:
            self.report.note("ACP schema not found (ACP_SCHEMA_DIR): frames are not validated")
            return
        try:
            self.report.validated_frames += client.validate(self.schema)
        except SchemaViolation as violation:
            self.report.find(f"a frame violates the ACP schema: {str(violation)[:400]}")

    async def traffic(self, seconds: float, *, then: Callable[[], Any] | None = None) -> None:
        """All workers for ``seconds``; ``then`` runs while they still run (the host kill)."""
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(worker.run)
            nursery.start_soon(self._watch_rss)
            await trio.sleep(seconds)
            if then is not None:
                await then()
            nursery.cancel_scope.cancel()
        self.report.traffic_s += time.monotonic() - started

    async def start_mcp_server(self, nursery: trio.Nursery) -> None:
        """The loopback MCP server sessions may attach (its own process, for the whole run)."""
        self.mcp_definition: dict[str, Any] | None = None
        if not MCP_SERVER_SCRIPT.exists():
            self.report.note("no loopback MCP server script: MCP operations skipped")
            return
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, os.fspath(MCP_SERVER_SCRIPT)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                check=False,
                env=self.env,
            )
        )
        assert process.stdout is not None
        line = b""
        with trio.move_on_after(STEP_DEADLINE_S):
            while b"\n" not in line and (data := await process.stdout.receive_some(4096)):
                line += data
        try:
            port = int(json.loads(line.split(b"\n", 1)[0])["port"])
        except (ValueError, KeyError, TypeError):
            self.report.note("the loopback MCP server did not start: MCP operations skipped")
            process.kill()
            return
        self.mcp_definition = {
            "type": "http",
            "name": MCP_NAME,
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers": [{"name": "X-Soak-Token", "value": "soak-header-value"}],
        }

    async def surge(self) -> None:
        """Every worker at once as a client that stops reading under a large stream: each
        connection's outbound buffer reaches its bound (~4 MiB), so the host's memory reaches
        the high-water mark that bounded buffers allow before the baseline is taken. Growth
        after that is not explained by a bound."""
        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(worker.stalled_reader)

    async def _watch_rss(self) -> None:
        """The host's RSS every ``RSS_EVERY_S`` while traffic runs (the figures' trend)."""
        while True:
            await trio.sleep(RSS_EVERY_S)
            process = self.host.process
            if process is None or process.returncode is not None:
                return
            try:
                sample = sample_process(process.pid)
            except OSError:
                return
            self.report.rss_trend.append((round(time.monotonic() - self.started), sample.rss))

    async def wait_idle(self, why: str) -> None:
        """No connection but the status query, no lease, no run: clients are all gone."""
        last: dict[str, Any] | None = None
        assert self.host.process is not None
        if self.host.process.returncode is not None:
            raise SoakAborted(f"{why}: the host exited {self.host.process.returncode}")
        deadline = HTTP_IDLE_DEADLINE_S if self.http_killed else IDLE_DEADLINE_S
        with trio.move_on_after(deadline):
            while True:
                if self.host.process.returncode is not None:
                    raise SoakAborted(f"{why}: the host exited {self.host.process.returncode}")
                last = await self.host.status()
                if last is not None and (
                    last.get("connections") == 1
                    and last.get("leases") == 0
                    and last.get("activeRuns") == 0
                ):
                    return
                await trio.sleep(POLL_S)
        self.report.find(f"{why}: not idle {deadline:.0f} s after every client left: {last}")

    async def quiet_sample(self) -> Sample:
        """The idle host's figures, RSS as the least of ``RSS_SAMPLES`` readings: a reading
        taken while the status query itself runs is not the host's resting size."""
        samples = []
        for _ in range(RSS_SAMPLES):
            samples.append(sample_process(self.host.pid))
            await trio.sleep(POLL_S)
        last = samples[-1]
        return Sample(
            rss=min(sample.rss for sample in samples),
            fds=last.fds,
            threads=last.threads,
            children=last.children,
        )

    async def settled_sample(self, baseline: Sample) -> Sample:
        """A sample once fds, threads and children are back to ``baseline`` (or the last one)."""
        deadline = trio.current_time() + SETTLE_DEADLINE_S
        while True:
            sample = await self.quiet_sample()
            if (
                sample.fds <= baseline.fds
                and sample.threads <= baseline.threads
                and sample.children <= baseline.children
            ) or trio.current_time() > deadline:
                return sample

    async def checkpoint(self, life: HostLife, why: str) -> None:
        """Traffic stopped: idle host, then figures against the life's baseline."""
        await self.wait_idle(why)
        if life.baseline is None:
            life.baseline = await self.quiet_sample()
            self.say(f"[{self.clock()}] baseline of host {life.pid}: {life.baseline.describe()}")
            return
        base = life.baseline
        sample = await self.settled_sample(base)
        life.final = sample
        growth = sample.rss - base.rss
        self.say(
            f"[{self.clock()}] {why}: {sample.describe()} (RSS growth {growth / 2**20:+.1f} MiB)"
        )
        if growth > MAX_RSS_GROWTH:
            self.report.find(f"{why}: host RSS grew {growth / 2**20:.1f} MiB after warm-up")
        for name in ("fds", "threads", "children"):
            if getattr(sample, name) > getattr(base, name):
                self.report.find(
                    f"{why}: host {name} {getattr(sample, name)} > baseline {getattr(base, name)}"
                )

    async def verify(self, why: str, *, everything: bool) -> None:
        """After a restart (or at the end): admitted messages replayed, deleted ones gone.

        ``VERIFIERS`` connections share the sessions, so a check costs seconds, not minutes."""
        ledger = self.ledger
        sessions = set(ledger.admitted) if everything else set(ledger.dirty)
        sessions -= ledger.deleted | ledger.maybe_deleted
        ordered = sorted(sessions)
        deleted = sorted(ledger.deleted)
        listed: set[str] = set()
        async with trio.open_nursery() as nursery:
            for index in range(VERIFIERS):
                nursery.start_soon(
                    self._verifier,
                    why,
                    ordered[index::VERIFIERS],
                    deleted[index::VERIFIERS],
                    listed if index == 0 else None,
                )
        ledger.dirty.clear()
        self.say(
            f"[{self.clock()}] {why}: verified {len(sessions)} sessions, {len(deleted)} deleted"
        )

    async def _verifier(
        self, why: str, sessions: list[str], deleted: list[str], listed: set[str] | None
    ) -> None:
        async with connector(self.connector_commands[0], self.socket, self.env) as process:
            assert process.stdin is not None
            assert process.stdout is not None
            async with open_acp_client(trio.StapledStream(process.stdin, process.stdout)) as client:
                with trio.fail_after(STEP_DEADLINE_S):
                    await client.initialize()
                listing = await self._listed(client)
                if listed is not None:
                    listed.update(listing)
                for session_id in sessions:
                    await self._verify_session(client, session_id, listing)
                    client.frames.clear()
                for session_id in deleted:
                    self.report.verified_deleted += 1
                    if session_id in listing:
                        self.report.find(f"{why}: deleted session {session_id} is listed")
                    try:
                        with trio.fail_after(STEP_DEADLINE_S):
                            await client.load_session(session_id, self.ledger.cwd[session_id])
                    except ProtocolError as error:
                        if error.code != -32002:
                            self.report.find(f"{why}: load of a deleted session: {error.code}")
                    else:
                        self.report.find(f"{why}: deleted session {session_id} loaded again")
                        await client.close_session(session_id)

    async def _listed(self, client: AcpTestClient) -> set[str]:
        listed: set[str] = set()
        cursor = None
        for _ in range(10_000):
            params = {} if cursor is None else {"cursor": cursor}
            with trio.fail_after(STEP_DEADLINE_S):
                page = await client.list_sessions(**params)
            listed.update(item["sessionId"] for item in page["sessions"])
            cursor = page.get("nextCursor")
            if cursor is None:
                break
        return listed

    async def _verify_session(
        self, client: AcpTestClient, session_id: str, listed: set[str]
    ) -> None:
        markers = self.ledger.admitted[session_id]
        if session_id not in listed:
            self.report.find(f"session {session_id} with admitted messages is not listed")
        try:
            with trio.fail_after(STEP_DEADLINE_S):
                await client.load_session(session_id, self.ledger.cwd[session_id])
        except ProtocolError as error:
            self.report.find(
                f"session {session_id} with {len(markers)} messages: load {error.code}"
            )
            return
        replayed = "".join(
            update["content"].get("text", "")
            for update in client.updates(session_id)
            if update.get("sessionUpdate") == "user_message_chunk"
        )
        for marker in markers:
            if marker not in replayed:
                self.report.find(f"admitted message {marker} of {session_id} lost")
        self.report.verified_sessions += 1
        self.report.verified_messages += len(markers)
        with trio.fail_after(STEP_DEADLINE_S):
            await client.close_session(session_id)

    def clock(self) -> str:
        return f"{time.monotonic() - self.started:6.1f} s"

    async def host_life(self, nursery: trio.Nursery, seconds: float, *, last: bool) -> None:
        self.http_killed = False
        await self.host.start(nursery)
        life = HostLife(pid=self.host.pid, started=time.monotonic())
        self.report.lives.append(life)
        self.say(f"[{self.clock()}] host {life.pid} ready")
        try:
            await self._live(life, seconds, last=last)
        except* SoakAborted:
            # The host ended on its own: a finding; the run goes on with the next life.
            process = self.host.process
            assert process is not None
            with trio.move_on_after(STEP_DEADLINE_S):
                await process.wait()
            await self.host.stderr.closed.wait()
            life.end = f"died on its own (exit {process.returncode})"
            tail = " | ".join(list(self.host.stderr.lines)[-3:])
            self.report.find(f"host {life.pid} {life.end}; its last lines: {tail[:600]}")
            if last:
                await self.host.start(nursery)
                await self.verify("after the host died", everything=True)
                await self.host.stop()
        life.integrity = integrity_check(self.data_dir)
        self.say(f"[{self.clock()}] host {life.pid} ended ({life.end}); store: {life.integrity}")
        if life.integrity != "ok":
            self.report.find(f"integrity_check after host {life.pid}: {life.integrity}")
        for line, count in collections.Counter(self.host.stderr.defects).items():
            self.report.find(f"host {life.pid} logged {count} times: {line[:300]}")

    async def _live(self, life: HostLife, seconds: float, *, last: bool) -> None:
        if len(self.report.lives) > 1:
            await self.verify(f"restart {len(self.report.lives) - 1}", everything=False)
        warmup = min(self.config.warmup_s, seconds / 3)
        await self.surge()
        await self.traffic(warmup)
        await self.checkpoint(life, "after warm-up")
        if last:
            await self.traffic(max(0.0, seconds - warmup))
            await self.checkpoint(life, "at the end")
            await self.verify("at the end", everything=True)
            code = await self.host.stop()
            life.end = f"SIGTERM, exit {code}"
            if code != 0:
                self.report.find(f"the host exited {code} on SIGTERM")
        else:
            await self.traffic(max(0.0, seconds - warmup - 3.0))
            await self.checkpoint(life, f"before kill {len(self.report.lives)}")
            # Then kill it under load.
            await self.traffic(3.0, then=self.host.kill)
            life.end = "SIGKILL under load"

    async def run(self) -> SoakReport:
        self.started = time.monotonic()
        total = self.config.seconds
        every = self.config.kill_every_s or total
        async with trio.open_nursery() as nursery:
            await self.start_mcp_server(nursery)
            remaining = total
            try:
                while remaining > 0:
                    seconds = min(every, remaining)
                    last = remaining - seconds < every / 2
                    if last:
                        seconds = remaining
                    await self.host_life(nursery, seconds, last=last)
                    remaining -= seconds
            except* (SoakAborted, ConnectionClosed, ProtocolError, trio.TooSlowError) as group:
                self.report.find(f"the soak stopped early: {group.exceptions!r}")
                process = self.host.process
                if process is not None and process.returncode is None:
                    process.kill()
                for line in self.host.stderr.lines:
                    self.report.find(f"host stderr: {line[:300]}")
            # The loopback MCP server (and anything else still running) ends with the run.
            nursery.cancel_scope.cancel()
        self.report.elapsed_s = time.monotonic() - self.started
        return self.report


async def run_soak(config: SoakConfig) -> SoakReport:
    """Run the whole soak in a private temporary directory (short, for the socket path)."""
    directory = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    try:
        return await Soak(config, directory).run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def format_report(report: SoakReport) -> str:
    allocator = " ".join(f"{k}={v}" for k, v in HOST_ALLOCATOR_ENV.items())
    lines = [
        f"soak: {report.elapsed_s:.0f} s in all, {report.traffic_s:.0f} s of traffic, "
        f"seed {report.config.seed}, {report.config.workers} workers; host allocator: {allocator}",
        f"operations: {report.total_ops} ({report.total_ops / max(report.traffic_s, 1e-9):.1f}/s)",
    ]
    for (op, outcome), count in sorted(report.ops.items()):
        lines.append(f"  {op:<12} {outcome:<12} {count}")
    lines.append(
        "connections: " + ", ".join(f"{k} {v}" for k, v in sorted(report.connections.items()))
    )
    lines.append("prompts: " + ", ".join(f"{k} {v}" for k, v in sorted(report.prompts.items())))
    for index, life in enumerate(report.lives, 1):
        base = life.baseline.describe() if life.baseline else "-"
        final = life.final.describe() if life.final else "-"
        growth = (
            f"{(life.final.rss - life.baseline.rss) / 2**20:+.1f} MiB"
            if life.final and life.baseline
            else "-"
        )
        lines.append(
            f"host life {index} (pid {life.pid}): baseline {base}; last check {final}; "
            f"RSS growth {growth}; ended {life.end}; integrity {life.integrity}"
        )
    lines.append(
        "host RSS under traffic (s: MiB): "
        + ", ".join(f"{t}: {rss / 2**20:.0f}" for t, rss in report.rss_trend)
    )
    lines.append(f"frames checked against the ACP schema: {report.validated_frames}")
    lines.append(
        f"verified: {report.verified_sessions} session loads, {report.verified_messages} admitted "
        f"messages, {report.verified_deleted} deleted-session checks"
    )
    for note in report.notes:
        lines.append(f"note: {note}")
    if report.findings:
        lines.append(f"FAILED: {len(report.findings)} findings")
        lines.extend(f"  - {finding}" for finding in report.findings)
    else:
        lines.append("passed: every check held")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=10.0)
    length.add_argument("--seconds", type=float)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds; 0: never")
    parser.add_argument("--host-log", type=Path, help="append the host's stderr to this file")
    parser.add_argument(
        "--validate-share",
        type=float,
        default=0.05,
        help="share of connections whose every frame is checked against the ACP schema",
    )
    parser.add_argument(
        "--network-share",
        type=float,
        default=0.25,
        help="share of connections over serve --http (half WebSocket, half Streamable HTTP)",
    )
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    config = SoakConfig(
        seconds=seconds,
        seed=args.seed,
        workers=args.workers,
        kill_every_s=args.kill_every or None,
        host_log=args.host_log,
        validate_share=args.validate_share,
        network_share=args.network_share,
    )
    report = trio.run(run_soak, config)
    print(format_report(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
