"""Who may talk to the network listener: the checks every request and WebSocket upgrade
passes before anything else (sans-I/O, a clock passed in).

In order: the ``Host`` header must name the listener (its bind address, ``localhost``, or a
configured name): a page whose DNS name was re-pointed at this machine sends its own name and
gets ``421``. An ``Origin`` outside the allowed list gets ``403`` (no list: no browser page at
all). Then the bearer token, from ``Authorization: Bearer`` or, for browsers' WebSockets, the
subprotocol ``acp.bearer.<token>``, compared in constant time. The right token is always
admitted, whatever its address did before: on loopback every local account is 127.0.0.1, and
behind a reverse proxy every client is the proxy. A missing or wrong one is ``401`` with no
detail, or ``429`` once its address has failed 10 times in the last second. A token file that
cannot be trusted (see :class:`~maple_acp.net._token.TokenFile`) admits nobody: ``503``,
counted as a failure. Only a request whose headers arrived is ever counted: a connection cut
before that (a reset stream, a half-open socket) never reaches the guard.

:class:`RefusalLog` says which refusals deserve an INFO line: a flood of bad requests must
not fill the log.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Final

import attrs

logger = logging.getLogger(__name__)

#: Failed authentications per address within one second before it is refused with 429.
MAX_AUTH_FAILURES_PER_S: Final = 10
#: The window those failures are counted in.
AUTH_FAILURE_WINDOW_S: Final = 1.0
#: Addresses whose recent failures are remembered; the oldest is forgotten beyond it (a
#: flood of spoofed sources cannot grow the table).
MAX_TRACKED_ADDRESSES: Final = 4096
#: Refusals of one address with one status within this of the one logged at INFO go to DEBUG,
#: counted; the count is logged when the window has ended (at the next refusal of anyone).
REFUSAL_LOG_WINDOW_S: Final = 60.0
#: (address, status) pairs whose repeats are counted; beyond it the oldest is reported and
#: forgotten (many addresses cannot grow the table).
MAX_LOGGED_REFUSERS: Final = 1024
#: How much of a refused request's header a log line shows (as a repr: no control characters).
MAX_LOGGED_HEADER_CHARS: Final = 200
#: The WebSocket subprotocol prefix that carries the token (browsers cannot set headers).
BEARER_SUBPROTOCOL_PREFIX: Final = "acp.bearer."
#: The subprotocol a client may offer beside it, which the listener then selects.
ACP_SUBPROTOCOL: Final = "acp"


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header, without its port, lowercased (``[::1]:8765`` -> ``::1``,
    ``[0:0::1]`` -> ``::1``), or ``None`` when the header is not a host and an optional
    numeric port: after a bracketed literal only ``:port`` may follow, and the brackets must
    hold an IPv6 address (``[::1]evil.example``, ``[::1]@evil.example`` and ``[127.0.0.1]``
    name nothing)."""
    value = header.strip().lower()
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or not _is_port_suffix(rest):
            return None
        try:
            return str(ipaddress.IPv6Address(inside))
        except ValueError:
            return None
    if value.count(":") == 1:
        value, _, port = value.partition(":")
        if not _is_port_suffix(":" + port):
            return None
    value = value.rstrip(".")
    return value or None


def _is_port_suffix(rest: str) -> bool:
    """Nothing, or ``:`` and the digits of a port (an empty port is the scheme's default)."""
    if not rest:
        return True
    port = rest[1:]
    return rest[0] == ":" and (not port or (port.isascii() and port.isdigit()))


#: An allowed origin as browsers send one: http or https, a host (a DNS name, an IPv4
#: address or a bracketed IPv6 one), an optional numeric port, nothing else.
_ORIGIN = re.compile(
    r"(?:http|https)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?",
    re.IGNORECASE | re.ASCII,
)


def origin_problem(entry: str) -> str | None:
    """Why ``entry`` cannot be an allowed origin (one line naming it), or ``None``: it must
    be ``scheme://host[:port]`` exactly as a browser's ``Origin`` header is (``*``, a bare
    ``127.0.0.1:8801`` or a trailing path never match one)."""
    match = _ORIGIN.fullmatch(entry)
    valid = match is not None
    if match is not None:
        host, port = match["host"], match["port"]
        if host.startswith("["):
            try:
                ipaddress.IPv6Address(host[1:-1])
            except ValueError:
                valid = False
        if port is not None and not 0 < int(port) <= 65535:
            valid = False
    if valid:
        return None
    return (
        f"the allowed origin {shown(entry)} is not scheme://host[:port] "
        "(http or https, a host, an optional port, nothing else)"
    )


#: The ports a browser leaves out of an ``Origin`` header, by scheme.
_DEFAULT_PORTS: Final = {"http://": ":80", "https://": ":443"}


def _as_sent(origin: str) -> str:
    """An allowed origin as a browser would send it: lowercase, without its scheme's default
    port (``https://IDE.example:443`` -> ``https://ide.example``)."""
    value = origin.strip().rstrip("/").lower()
    for scheme, port in _DEFAULT_PORTS.items():
        if value.startswith(scheme) and value.endswith(port):
            return value.removesuffix(port)
    return value


def shown(value: str) -> str:
    """A header value in a log line or an error: quoted, escaped, bounded."""
    text = repr(value)
    if len(text) > MAX_LOGGED_HEADER_CHARS:
        text = text[: MAX_LOGGED_HEADER_CHARS - 3] + "..."
    return text


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.frozen
class GuardPolicy:
    #: Names a ``Host`` header may carry (lowercase, no port).
    allowed_hosts: frozenset[str]
    #: Exact origins (``https://ide.example``) a browser page may come from.
    allowed_origins: frozenset[str]

    @classmethod
    def for_bind(
        cls, bind_host: str, hosts: Iterable[str] = (), origins: Iterable[str] = ()
    ) -> GuardPolicy:
        bind_name = host_name(bind_host) or bind_host
        names = {bind_name, "localhost", *filter(None, (host_name(h) for h in hosts))}
        if is_loopback(bind_name):
            names.update({"127.0.0.1", "::1"})
        return cls(
            allowed_hosts=frozenset(names),
            allowed_origins=frozenset(_as_sent(o) for o in origins),
        )


class AuthFailures:
    """Failed authentications per address in a sliding one-second window."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._recent: OrderedDict[str, deque[float]] = OrderedDict()

    def _window(self, address: str) -> deque[float] | None:
        times = self._recent.get(address)
        if times is None:
            return None
        cutoff = self._clock() - AUTH_FAILURE_WINDOW_S
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._recent[address]
            return None
        return times

    def throttled(self, address: str) -> bool:
        times = self._window(address)
        return times is not None and len(times) >= MAX_AUTH_FAILURES_PER_S

    def record(self, address: str) -> None:
        times = self._window(address)
        if times is None:
            times = self._recent[address] = deque()
            while len(self._recent) > MAX_TRACKED_ADDRESSES:
                self._recent.popitem(last=False)
        self._recent.move_to_end(address)
        times.append(self._clock())
        if len(times) > MAX_AUTH_FAILURES_PER_S:
            times.popleft()


@attrs.frozen
class Repeats:
    """Refusals logged at DEBUG after the INFO one for the same address and status."""

    address: str
    status: int
    count: int
    #: From the refusal logged at INFO to the last repeat.
    seconds: float


@attrs.define
class _Window:
    started: float
    last: float
    count: int = 0


class RefusalLog:
    """Which refusals to log at INFO: the first of each (address, status) pair in a window of
    ``window_s``; the repeats within it are counted and reported, as :class:`Repeats`, once
    the window has ended or the pair is forgotten to make room."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        window_s: float = REFUSAL_LOG_WINDOW_S,
        max_tracked: int = MAX_LOGGED_REFUSERS,
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._max_tracked = max_tracked
        #: Oldest window first: each is added at the end when it starts.
        self._windows: OrderedDict[tuple[str, int], _Window] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def note(self, address: str, status: int) -> tuple[bool, list[Repeats]]:
        """Count one refusal: whether it is the one to log at INFO, and the repeats of
        windows that ended (or were forgotten) since the last call, to report."""
        now = self._clock()
        ended: list[Repeats] = []
        windows = self._windows
        cutoff = now - self._window_s
        while windows:
            oldest, opened = next(iter(windows.items()))
            if opened.started > cutoff:
                break
            del windows[oldest]
            _report(ended, oldest, opened)
        key = (address, status)
        window = windows.get(key)
        if window is not None:
            window.count += 1
            window.last = now
            return False, ended
        windows[key] = _Window(started=now, last=now)
        while len(windows) > self._max_tracked:
            _report(ended, *windows.popitem(last=False))
        return True, ended


def _report(ended: list[Repeats], key: tuple[str, int], window: _Window) -> None:
    if window.count:
        ended.append(Repeats(key[0], key[1], window.count, window.last - window.started))


def bearer_from_header(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def bearer_from_subprotocols(offered: Iterable[str]) -> str | None:
    for protocol in offered:
        if protocol.startswith(BEARER_SUBPROTOCOL_PREFIX):
            return protocol[len(BEARER_SUBPROTOCOL_PREFIX) :]
    return None


def chosen_subprotocol(offered: Iterable[str]) -> str | None:
    """What the listener answers to a client's subprotocol offer: ``acp`` when offered (so
    the token is not echoed), else the bearer one it authenticated with, else none."""
    offered = list(offered)
    if ACP_SUBPROTOCOL in offered:
        return ACP_SUBPROTOCOL
    for protocol in offered:
        if protocol.startswith(BEARER_SUBPROTOCOL_PREFIX):
            return protocol
    return None


class TokenUnavailable(Exception):
    """The host's token cannot be trusted now (its file vanished, or others can read it):
    nobody is admitted until it is fixed. The message is one line without the token."""


@attrs.frozen
class Refusal:
    status: int
    #: One short reason for the log (never a header value, never the token).
    reason: str


class RequestGuard:
    """See the module docstring. ``token_matches`` compares an offered token with the host's
    in constant time, or raises :class:`TokenUnavailable`."""

    def __init__(
        self,
        policy: GuardPolicy,
        token_matches: Callable[[str], bool],
        clock: Callable[[], float],
    ) -> None:
        self.policy = policy
        self._token_matches = token_matches
        self._failures = AuthFailures(clock)
        self.refusals = RefusalLog(clock)

    def check_host(self, host: str | None) -> Refusal | None:
        name = None if host is None else host_name(host)
        if name is None or name not in self.policy.allowed_hosts:
            return Refusal(421, "a Host header that does not name this listener")
        return None

    def check_origin(self, origin: str | None) -> Refusal | None:
        if origin is None:
            return None
        if origin.strip().rstrip("/").lower() not in self.policy.allowed_origins:
            return Refusal(403, "an Origin that is not allowed")
        return None

    def origin_allowed(self, origin: str | None) -> bool:
        return origin is not None and self.check_origin(origin) is None

    def check_token(self, address: str, token: str | None) -> Refusal | None:
        try:
            if token is not None and self._token_matches(token):
                return None
            refusal = Refusal(401, "a missing or wrong bearer token")
        except TokenUnavailable:
            refusal = Refusal(503, "the host's token file cannot be trusted now")
        # Only a refused request counts, and only against its own address's next refusals:
        # the right token was admitted above whatever the count.
        throttled = self._failures.throttled(address)
        self._failures.record(address)
        if throttled:
            return Refusal(429, "too many failed authentications from one address")
        return refusal

    def admit(
        self, *, address: str, host: str | None, origin: str | None, token: str | None
    ) -> Refusal | None:
        """The first refusal a request earns, or ``None`` when it may go on."""
        return (
            self.check_host(host) or self.check_origin(origin) or self.check_token(address, token)
        )
