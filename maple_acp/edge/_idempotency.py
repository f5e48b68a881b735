"""A v2 prompt's idempotency key: the user message is inserted at most once per key and
session, and a prompt sent again with a known key is answered as its original was.

Over the network a prompt whose answer was lost is sent again; the key makes that safe. The
key, once its message is inserted, is stored with the message (the store keeps a session's
latest 1,024, across restarts): a retry then starts nothing and gets the original's answer at
once. A retry that arrives while its original has not been answered yet waits for that answer
and gets the same (the same error, if the original was refused or cancelled before its
message was inserted: then the key inserted nothing and a later retry starts afresh).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from maple_acp.rpc import admitted
from maple_acp.runtime import SessionLease
from maple_acp.wire import REQUEST_CANCELLED, ProtocolError

logger = logging.getLogger(__name__)


class _Original:
    """The first prompt with a key, until it is answered: its answer or its error."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: object = None
        self.error: Exception | None = None


class PromptKeys:
    """The keyed prompts of one session on one connection that have not been answered yet."""

    def __init__(self) -> None:
        self._originals: dict[str, _Original] = {}

    async def answer(
        self,
        lease: SessionLease,
        key: str,
        answer_for: Callable[[str], object],
        start: Callable[[], Awaitable[object]],
    ) -> object:
        """The answer to a prompt with ``key``: ``answer_for(message_id)`` if the key is
        known, the original's if one is being answered, else what ``start()`` (the prompt
        itself) answers."""
        original = self._originals.get(key)
        if original is not None:
            logger.debug("a prompt sent again with a key in use waits for its original")
            # Decided: it is the original's retry. The requests after it need not wait for
            # the original's answer (a queued one waits for the turns before it).
            admitted()
            await original.done.wait()
            if original.error is not None:
                raise original.error
            return original.answer
        original = _Original()
        # Registered before any checkpoint: a retry written right behind finds it.
        self._originals[key] = original
        try:
            known = await lease.keyed_message(key)
            if known is not None:
                logger.debug("a prompt sent again with a known key starts nothing")
                original.answer = answer_for(known)
            else:
                original.answer = await start()
            return original.answer
        except Exception as exc:
            original.error = exc
            raise
        except BaseException:
            original.error = ProtocolError(
                REQUEST_CANCELLED, "the prompt with this key was cancelled before it was accepted"
            )
            raise
        finally:
            del self._originals[key]
            original.done.set()
