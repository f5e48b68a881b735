"""What a provider fault means for a turn: retry it (and after how long), or end the turn with
one safe line. Plain functions of status codes and headers, so the rules are tested without a
server. No line ever carries the provider's own error text: it may quote the key.

A rate limit (HTTP 429, or an overloaded provider) whose reset is further off than the retry
bound is waited out when it resets within ``max_rate_limit_wait``, after a notice naming the
retry time; later than that, the turn fails with one line naming the reset time.

Cancellation: every wait is a plain ``trio.sleep`` in the caller's scope (the run's), so a
cancel ends a wait of any length at once."""

from __future__ import annotations

import datetime
import email.utils
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import attrs
import trio

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Retries after the first attempt, for rate limits, server errors and lost connections.
MAX_RETRIES = 3
#: All retrying of one model request (the waits and the attempts) ends within this bound.
RETRY_BUDGET_S = 30.0
#: Backoff before retry 1, 2, 3 when the provider gives no ``Retry-After``.
BACKOFF_S = (1.0, 2.0, 4.0)
#: Statuses and error codes that mean "busy, come back later" like a 429 (Anthropic's).
OVERLOADED_STATUS = 529
OVERLOADED_CODES = frozenset({"overloaded_error", "overloaded"})

#: The shortest wait before a retry, whatever the provider says (``Retry-After: 0`` is "now"
#: to a server that has not yet recovered).
MIN_RETRY_WAIT_S = 1.0
#: A reset further off than this is read as this far off (ten years): beyond any wait, and
#: still a date a clock can name.
MAX_RESET_S = 10 * 365 * 86_400.0

#: Error codes (or types) that say a request is longer than the model's context window:
#: OpenAI's, and llama.cpp's server's (which also gives ``n_prompt_tokens`` and ``n_ctx``).
CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
#: Words of a 4xx error message that say the same where no code does (Anthropic's "prompt is
#: too long", vLLM's "maximum context length"): read to classify, never shown.
CONTEXT_MARKERS = ("context length", "context window", "context size", "prompt is too long")
#: Token counts a provider's error body may give are read up to this (anything larger is not
#: a count).
MAX_COUNTED_TOKENS = 1 << 40

MALFORMED_STREAM = "the provider sent a malformed stream"
BROKEN_STREAM = "the provider's stream broke off before the answer ended"
STREAM_ERROR = "the provider reported an error inside its stream"


class ProviderFault(Exception):
    """A request that failed. ``line`` is one safe sentence; ``retryable`` says whether the
    same request may be sent again; ``retry_after`` is the provider's own wait, if it gave one."""

    def __init__(
        self,
        line: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        rate_limited: bool = False,
    ):
        super().__init__(line)
        self.line = line
        self.retryable = retryable
        self.retry_after = retry_after
        #: A rate limit or an overload: a reset past the retry bound may be waited out.
        self.rate_limited = rate_limited
        #: The provider said the request is longer than the model's context window.
        self.beyond_window = False
        #: The provider's own counts, when it gave them: the request's tokens, its window.
        self.counted: tuple[int | None, int | None] = (None, None)
        #: The HTTP status that said so, when one did.
        self.status: int | None = None

    def resets_late(self) -> bool:
        """A rate limit whose provider-given reset is past the retry bound."""
        return (
            self.rate_limited and self.retry_after is not None and self.retry_after > RETRY_BUDGET_S
        )


def status_fault(
    status: int, headers: Mapping[str, str], body: object, model: str, *, now: float | None = None
) -> ProviderFault:
    """The fault for an HTTP error status from the provider."""
    if status in (401, 403):
        return ProviderFault(f"the provider refused the credentials (HTTP {status})")
    code = error_code(body)
    if status == 404 or code == "model_not_found":
        return ProviderFault(
            f"the provider does not know the model {model[:200]!r} (HTTP {status})"
        )
    if code in CONTEXT_CODES or (status < 500 and _says_too_long(body)):
        # Before the server-error rules: a request that cannot fit is never sent again.
        return window_fault(*_counts(body), status=status)
    if status == 429:
        return ProviderFault(
            "the provider is limiting the rate of requests (HTTP 429)",
            retryable=True,
            retry_after=retry_after_seconds(headers, now=now),
            rate_limited=True,
        )
    if status == OVERLOADED_STATUS or (status >= 500 and code in OVERLOADED_CODES):
        return ProviderFault(
            f"the provider is overloaded (HTTP {status})",
            retryable=True,
            retry_after=retry_after_seconds(headers, now=now),
            rate_limited=True,
        )
    if status >= 500:
        return ProviderFault(
            f"the provider failed to answer (HTTP {status})",
            retryable=True,
            retry_after=retry_after_seconds(headers, now=now),
        )
    if 300 <= status < 400:
        return ProviderFault(f"the provider answered with a redirect (HTTP {status}), not followed")
    return ProviderFault(f"the provider rejected the request (HTTP {status})")


def window_fault(
    tokens: int | None, window: int | None, *, status: int | None = None
) -> ProviderFault:
    """A request longer than the model's context window, with what is known of both sizes
    (``tokens`` an estimate unless the provider counted): never retried, since the same
    request cannot fit the next time either."""
    size = f" (~{tokens:,} tokens)" if tokens is not None else ""
    of = f" of {window:,} tokens" if window is not None else ""
    said = f" (HTTP {status})" if status is not None else ""
    fault = ProviderFault(f"the request{size} does not fit the model's context window{of}{said}")
    fault.beyond_window = True
    fault.counted = (tokens, window)
    fault.status = status
    return fault


def beyond_window(fault: ProviderFault, tokens: int | None, window: int | None) -> ProviderFault:
    """What ``fault`` of a request estimated at ``tokens`` for a model whose configured window
    is ``window`` means: a context-window fault naming both (the provider's counts when it
    gave them) when the provider said so or the estimate does not fit; else ``fault`` itself.
    A local server may only break its stream off at such a request: retrying it was three
    more failures and no word on why."""
    too_long = tokens is not None and window is not None and tokens >= window
    if fault.beyond_window:
        counted_tokens, counted_window = fault.counted
        # The provider's counts are its tokenizer's and its server's: truer than ours. An
        # estimate that fits the window is not shown beside the provider's word that it does
        # not: one of them would look wrong.
        return window_fault(
            counted_tokens if counted_tokens is not None else (tokens if too_long else None),
            counted_window if counted_window is not None else window,
            status=fault.status,
        )
    if too_long:
        return window_fault(tokens, window)
    return fault


def _says_too_long(body: object) -> bool:
    message = _error_field(body, "message")
    return isinstance(message, str) and any(marker in message.lower() for marker in CONTEXT_MARKERS)


def _counts(body: object) -> tuple[int | None, int | None]:
    """The request's tokens and the window, as a provider's error body counts them
    (llama.cpp's server: ``n_prompt_tokens``, ``n_ctx``)."""
    return _count(_error_field(body, "n_prompt_tokens")), _count(_error_field(body, "n_ctx"))


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_COUNTED_TOKENS:
        return value
    return None


def _error_field(body: object, name: str) -> object:
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error", body)
    return inner.get(name) if isinstance(inner, Mapping) else None


def stream_error(code: object = None) -> ProviderFault:
    """The fault of an error event inside a stream that began well: an overload (``code``
    one of ``OVERLOADED_CODES``) is a rate limit, retried while nothing was forwarded;
    anything else one line without the provider's text (it may quote the request or key)."""
    if code in OVERLOADED_CODES:
        return ProviderFault(
            "the provider is overloaded (an error event in its stream)",
            retryable=True,
            rate_limited=True,
        )
    return ProviderFault(STREAM_ERROR)


def untrusted_certificate(where: str) -> ProviderFault:
    """Retrying cannot make an untrusted certificate trusted."""
    return ProviderFault(f"the provider at {where} has a TLS certificate not trusted here")


def connection_fault(where: str, *, timed_out: bool) -> ProviderFault:
    if timed_out:
        return ProviderFault(f"the provider at {where} did not answer in time", retryable=True)
    return ProviderFault(f"could not reach the provider at {where}", retryable=True)


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The provider's ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if it
    gave one that reads as a time: however far off (a day, a year), it is the reset, and the
    caller decides whether to wait for it. A date already past is a wait of zero."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        value = _seconds(millis)
        if value is not None:
            return value / 1000
    text = headers.get("retry-after")
    if text is None:
        return None
    value = _seconds(text)
    if value is not None:
        return value
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _seconds(text: str) -> float | None:
    """A non-negative, finite number of seconds (no later than ``MAX_RESET_S``), if ``text``
    is one."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not 0 <= value < math.inf:
        return None
    return min(value, MAX_RESET_S)


@attrs.frozen
class RetryPlan:
    """Whether to retry after ``fault`` as attempt ``retries_done + 1`` with ``elapsed`` seconds
    of the budget spent: the wait, or ``None`` to give up."""

    fault: ProviderFault
    retries_done: int
    elapsed: float
    backoff: Sequence[float] = BACKOFF_S

    def wait(self) -> float | None:
        if not self.fault.retryable or self.retries_done >= MAX_RETRIES:
            return None
        delay = self.fault.retry_after
        if delay is None:
            delay = self.backoff[min(self.retries_done, len(self.backoff) - 1)]
        else:
            delay = max(delay, MIN_RETRY_WAIT_S)
        if self.elapsed + delay > RETRY_BUDGET_S:
            return None
        return delay


def rate_limit_wait(
    fault: ProviderFault, retries_done: int, waited: float, max_wait: float
) -> float | None:
    """The wait for a rate limit that resets past the retry bound: its reset, when that fits in
    what ``max_wait`` leaves after the ``waited`` seconds already spent on such waits; else
    ``None``. The retry count bounds these waits as it bounds the short ones."""
    if not fault.resets_late() or retries_done >= MAX_RETRIES:
        return None
    delay = fault.retry_after
    if delay is None or waited + delay > max_wait:
        return None
    return delay


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    backoff: Sequence[float] = BACKOFF_S,
    label: str = "",
    notify: Callable[[str], Awaitable[None]] | None = None,
    max_rate_limit_wait: float = 0.0,
) -> T:
    """``await attempt()``, again after each retryable ``ProviderFault`` while ``RetryPlan``
    allows (or, for a rate limit resetting later, while ``rate_limit_wait`` allows); then the
    last fault, its line saying how many retries were made (and when a late limit resets).
    Before each wait ``notify`` (the turn's warning notice) tells the user why nothing arrives.
    The waits are plain Trio sleeps: a cancel ends them at once."""
    started = trio.current_time()
    retries = 0
    waited_for_limits = 0.0
    while True:
        try:
            return await attempt()
        except ProviderFault as fault:
            wait = RetryPlan(fault, retries, trio.current_time() - started, backoff).wait()
            late = wait is None and fault.resets_late()
            if late:
                wait = rate_limit_wait(fault, retries, waited_for_limits, max_rate_limit_wait)
            if wait is None:
                raise ProviderFault(give_up_line(fault, retries, max_rate_limit_wait)) from None
            logger.info("%s%s; retry %d in %.1f s", label, fault.line, retries + 1, wait)
            if notify is not None:
                when = f"at {utc_clock(wait)} UTC (in {wait:.0f} s)" if late else f"in {wait:.0f} s"
                await notify(f"{fault.line}; retrying {when}")
            await trio.sleep(wait)
            retries += 1
            if late:
                waited_for_limits += wait
                # The retry bound is for bursts of short waits; after the reset it starts over.
                started = trio.current_time()


def utc_clock(seconds_from_now: float) -> str:
    """The wall-clock time (``HH:MM:SS``, UTC) ``seconds_from_now`` seconds from now, with its
    date (``YYYY-MM-DD HH:MM:SS``) when that is not today."""
    now = datetime.datetime.now(datetime.UTC)
    moment = now + datetime.timedelta(seconds=min(seconds_from_now, MAX_RESET_S))
    if moment.date() != now.date():
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return moment.strftime("%H:%M:%S")


def give_up_line(fault: ProviderFault, retries_done: int, max_rate_limit_wait: float = 0.0) -> str:
    if not fault.retryable:
        return fault.line
    if fault.resets_late() and fault.retry_after is not None:
        done = "not retried" if retries_done == 0 else f"gave up after {_retries(retries_done)}"
        beyond = (
            ""
            if retries_done >= MAX_RETRIES
            else f", past max_rate_limit_wait ({max_rate_limit_wait:.0f} s)"
        )
        return (
            f"{fault.line}; {done}: the limit resets at {utc_clock(fault.retry_after)} UTC "
            f"(in {fault.retry_after:.0f} s){beyond}"
        )
    if retries_done == 0:
        return f"{fault.line}; not retried (its wait exceeds {RETRY_BUDGET_S:.0f} s)"
    return f"{fault.line}; gave up after {_retries(retries_done)}"


def _retries(count: int) -> str:
    return f"{count} retry" if count == 1 else f"{count} retries"


def error_code(body: object) -> str | None:
    """The ``code`` (else the ``type``) of an error body, top-level or under ``error``."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            code = inner.get("code")
            if isinstance(code, str):
                return code
            kind = inner.get("type")
            if isinstance(kind, str):
                return kind
    return None
