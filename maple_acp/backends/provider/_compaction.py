"""Compaction, the shell's part: when a request would fill most of a known context window (or
on ``/compact``), the model summarizes the older part of the conversation, the summary is
stored as a ``COMPACTION`` row of the history, and requests carry the summary and the recent
turns instead (what a history keeps after one: ``after_compaction``).

The shell decides when (at most once a turn, before a request), tells the caller
(``CompactionChanged``), stores the summary, and drops the turn's transcript after one. An
engine's :class:`Exchange` that compacts is also a :class:`Compacting`: its estimate of a
request over its own messages, where its conversation may be cut, its summary request, and
its messages after the summary."""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

from maple_acp.backends.provider._faults import ProviderFault
from maple_acp.runtime import CommandInfo, Turn

#: A request whose estimate (or the provider's last count) reaches this part of a known
#: context window compacts first.
COMPACT_AT_FRACTION: Final = 0.85
#: The summary's output bound (tokens): without one a local server lets a model that rambles
#: write until the turn's timeout (two minutes of a small model's summary were seen).
SUMMARY_MAX_TOKENS: Final = 1024
#: What the model is asked, after the part of the conversation it summarizes.
SUMMARY_REQUEST: Final = (
    "Summarize the conversation so far for your own later use: the user's goals and "
    "instructions, what was done and found (files, commands, results), decisions made, and "
    "what remains open. Be concise and concrete; answer with the summary only."
)
#: What ``/compact`` says when the conversation has no older part yet.
NOTHING_TO_COMPACT: Final = "There is nothing to compact yet."
#: The command an engine that compacts offers.
COMPACT_INFO: Final = CommandInfo(
    name="compact", description="Summarize the conversation so far, to free the context window"
)


@runtime_checkable
class Compacting(Protocol):
    """What an engine's exchange adds to compact. ``cut`` is an index into the engine's
    messages: the older part (summarized) is before it, the recent part from it on."""

    #: The model's context window when known (without one only ``/compact`` compacts).
    window: int | None
    #: The provider's last count of the context used (0 before one).
    used: int
    #: Set by the shell: at most one compaction a turn (what is left after one is the turn's
    #: own work), and a compacted turn keeps no transcript (its messages no longer start
    #: where the run did).
    compacted: bool

    def estimate(self) -> int:
        """The estimated tokens of the next request (its system prompt and messages)."""
        ...

    def split(self) -> int | None:
        """Where the recent part of the messages starts; ``None`` when nothing is older."""
        ...

    async def summarize(self, cut: int, compaction_id: str) -> str:
        """Ask the model for a summary of the messages before ``cut`` (no tools, at most
        :data:`SUMMARY_MAX_TOKENS`), its text sent to compaction ``compaction_id`` as it
        comes and its usage reported; the summary. Raises ``ProviderFault``."""
        ...

    def summarized(self, cut: int, summary: str) -> None:
        """Go on with ``summary`` in place of the messages before ``cut``."""
        ...


async def compact(turn: Turn, exchange: Compacting) -> bool | None:
    """Compact the exchange's conversation: whether it was, ``None`` when nothing is older.
    A failed summary is told as a failed compaction, stores nothing, and the turn goes on."""
    cut = exchange.split()
    if cut is None:
        return None
    compaction_id = await turn.start_compaction()
    try:
        summary = await exchange.summarize(cut, compaction_id)
    except ProviderFault as fault:
        await turn.end_compaction(compaction_id, error=fault.line)
        return False
    if not await turn.end_compaction(compaction_id):
        return False
    exchange.summarized(cut, summary)
    return True


async def compact_if_full(turn: Turn, exchange: Compacting) -> None:
    """Compact before a request that would fill :data:`COMPACT_AT_FRACTION` of a known
    window, once a turn."""
    window = exchange.window
    if window is None or exchange.compacted:
        return
    exchange.used = max(exchange.used, exchange.estimate())
    if exchange.used >= window * COMPACT_AT_FRACTION:
        exchange.compacted = True
        await compact(turn, exchange)
