"""A lease's prompt queue: prompts that arrive while a prompt's turn runs wait their turn, first
in first out, instead of being refused.

The queue is fed through the lease's ``PromptSlot``: when the slot frees (a prompt's claim
ends) or a prompt's run ends, the head of the queue is handed the slot at once, in the same
step, so no other claim can slip in between. A waiting prompt's message is not in the history:
it is admitted only once its own claim starts its run, so nothing queued survives a restart.

Withdrawing (the caller's cancel, a remove, a clear, the lease's revocation) wakes each
withdrawn prompt with no claim: its caller answers it as cancelled. Nothing else is undone,
since nothing of it was admitted.

Resource handling: plain state and one event per waiting prompt. Error handling: the 9th
waiting prompt is ``RUN_ACTIVE`` naming the limit. Cancellation: a prompt whose caller stops
waiting leaves the queue (or, if it was just handed the slot, frees the slot for the next).
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio

from maple_acp._text import one_line
from maple_acp.runtime._barrier import PromptClaim, PromptSlot
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._lease_life import LeaseGuard
from maple_acp.runtime._session_events import QueuedPrompt

#: Prompts one session holds waiting behind its running turn: enough to type ahead, few
#: enough that a client that floods a session is told so rather than holding memory.
MAX_QUEUED_PROMPTS: Final = 8
#: A waiting prompt's text as a listing shows it (the text itself waits whole).
MAX_PREVIEW_CHARS: Final = 200
#: How much of a prompt's text a preview is made from, in previews' lengths: a prompt of
#: megabytes is not scanned whole for its first line.
PREVIEW_READ_FACTOR: Final = 8


@attrs.frozen
class Withdrawn:
    """What the claim of a prompt withdrawn while it waited yields. ``order`` numbers the
    withdrawn prompts of the prompt's window (1 for the first), in the order they were
    withdrawn (queue order within one cancel or clear): a window answers them in that order,
    and never waits for another window's."""

    order: int


class _NoWindow:
    """The window of the prompts queued without one (weakly referable, as windows are)."""


_ONE_WINDOW: Final = _NoWindow()


class _Waiting:
    """A prompt in the queue: its listing, and what it is woken with (a claim on the slot, or
    its withdrawal)."""

    __slots__ = ("claim", "info", "window", "withdrawn", "woken")

    def __init__(self, info: QueuedPrompt, window: object) -> None:
        self.info = info
        self.window = window
        self.woken = trio.Event()
        self.claim: PromptClaim | None = None
        self.withdrawn = Withdrawn(0)


class PromptQueue:
    """The waiting prompts of one lease. ``prompt_running`` tells whether a prompt's run (one
    that holds no claim: a steering message's turn) is still active; ``changed`` is told the
    queue after every change."""

    def __init__(
        self,
        *,
        slot: PromptSlot,
        guard: LeaseGuard,
        prompt_running: Callable[[], bool],
        now_ms: Callable[[], int],
        changed: Callable[[tuple[QueuedPrompt, ...]], None],
    ) -> None:
        self._slot = slot
        self._guard = guard
        self._prompt_running = prompt_running
        self._now_ms = now_ms
        self._changed = changed
        self._waiting: list[_Waiting] = []
        self._serial = 0
        #: Prompts withdrawn so far, per window (a window gone is forgotten).
        self._withdrawn: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        slot.on_free = self._hand_on

    @property
    def entries(self) -> tuple[QueuedPrompt, ...]:
        return tuple(waiting.info for waiting in self._waiting)

    def _free(self) -> bool:
        return not self._slot.held and not self._prompt_running()

    @asynccontextmanager
    async def claim(
        self, text: str, decided: Callable[[], None], window: object = None
    ) -> AsyncIterator[PromptClaim | Withdrawn]:
        """The slot for a prompt with ``text``, held for the block: at once when the session is
        free and nobody waits, else once every prompt queued before it has had its turn.
        ``decided`` is called as the prompt takes the slot or its place in the queue. Yields
        ``Withdrawn`` when the prompt was withdrawn while it waited (it is answered
        cancelled); ``window`` (``None``: the lease's own) numbers its withdrawals."""
        with self._guard.operation():
            self._hand_on()
            if not self._waiting and self._free():
                with self._slot.hold() as claim:
                    decided()
                    yield claim
                return
            if len(self._waiting) >= MAX_QUEUED_PROMPTS:
                raise RuntimeRejection(
                    RejectionKind.RUN_ACTIVE,
                    f"the prompt queue is full: at most {MAX_QUEUED_PROMPTS} prompts wait "
                    "while a turn runs",
                )
            waiting = self._enter(text, _ONE_WINDOW if window is None else window)
            decided()
            try:
                await waiting.woken.wait()
            except BaseException:
                self._leave(waiting)
                raise
            handed = waiting.claim
            if handed is None:
                yield waiting.withdrawn
                return
            try:
                yield handed
            finally:
                self._slot.release(handed)

    def _enter(self, text: str, window: object) -> _Waiting:
        # Enough of a long prompt to fill a preview once its whitespace runs collapse.
        head = text[: MAX_PREVIEW_CHARS * PREVIEW_READ_FACTOR]
        self._serial += 1
        info = QueuedPrompt(
            entry_id=f"q{self._serial}-{secrets.token_hex(3)}",
            preview=one_line(head, MAX_PREVIEW_CHARS) if head.strip() else "",
            queued_ms=self._now_ms(),
        )
        waiting = _Waiting(info, window)
        self._waiting.append(waiting)
        self._changed(self.entries)
        return waiting

    def _leave(self, waiting: _Waiting) -> None:
        """The caller stopped waiting: out of the queue, or the slot it was just handed freed."""
        if waiting in self._waiting:
            self._waiting.remove(waiting)
            self._changed(self.entries)
        elif waiting.claim is not None:
            self._slot.release(waiting.claim)

    def _hand_on(self) -> None:
        """The slot or the running prompt changed: hand the slot to the head of the queue if
        the session is free (called by the slot, in the step that freed it)."""
        if not self._waiting or not self._free():
            return
        head = self._waiting.pop(0)
        head.claim = self._slot.take()
        head.woken.set()
        self._changed(self.entries)

    # -- withdrawing -------------------------------------------------------------------------

    def remove(self, entry_id: str) -> bool:
        """Withdraw the waiting prompt ``entry_id``; False when no prompt waits with that id."""
        self._guard.check_live()
        for waiting in self._waiting:
            if waiting.info.entry_id == entry_id:
                self._waiting.remove(waiting)
                self._withdraw(waiting)
                self._changed(self.entries)
                return True
        return False

    def clear(self) -> int:
        """Withdraw every waiting prompt, first to last; how many there were."""
        withdrawn, self._waiting = self._waiting, []
        for waiting in withdrawn:
            self._withdraw(waiting)
        if withdrawn:
            self._changed(())
        return len(withdrawn)

    def _withdraw(self, waiting: _Waiting) -> None:
        order = self._withdrawn[waiting.window] = self._withdrawn.get(waiting.window, 0) + 1
        waiting.withdrawn = Withdrawn(order)
        waiting.woken.set()
