"""``async with thing:`` for anything with a trio-style ``serve(task_status=...)``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self

import trio


class ServedInOwnNursery:
    """Runs ``self.serve`` in a nursery of its own from ``__aenter__`` (which returns once it
    reported ready) until the ``async with`` block ends (which cancels it)."""

    _nursery_cm: AbstractAsyncContextManager[trio.Nursery] | None = None
    _nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        """``async with service:`` runs ``serve`` in a nursery of its own until the block
        ends."""
        nursery_cm = trio.open_nursery()
        nursery = await nursery_cm.__aenter__()
        self._nursery_cm, self._nursery = nursery_cm, nursery
        try:
            await nursery.start(self.serve)
        except BaseException as exc:
            nursery.cancel_scope.cancel()
            self._nursery_cm = self._nursery = None
            if not await nursery_cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        nursery_cm, nursery = self._nursery_cm, self._nursery
        assert nursery_cm is not None
        assert nursery is not None
        self._nursery_cm = self._nursery = None
        nursery.cancel_scope.cancel()
        return await nursery_cm.__aexit__(exc_type, exc, tb)
