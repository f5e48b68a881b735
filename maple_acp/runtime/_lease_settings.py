"""A lease's session settings: the task's model (locked once the task has a message), its
session mode, its thinking effort and its boolean options, each stored with the task."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from maple_acp.model import SessionMode, TaskRecord
from maple_acp.runtime._barrier import PromptSlot
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._lease_life import LeaseGuard
from maple_acp.runtime._models import ModelChoices
from maple_acp.runtime._modes import ModeDeclaration, ModeSet
from maple_acp.runtime._options import BooleanOption, option_values
from maple_acp.runtime._session_events import ModeChanged, SessionEvent
from maple_acp.runtime._task_row import TaskRow
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)


class SessionSettings:
    """The model, mode, thinking effort and boolean options of one leased task. Each change
    is written under the prompt slot's admission lock, so it is ordered against a prompt's
    admission: the first admitted message is what locks the model.

    Hooks: ``model_choices`` (the catalog for the lease's account, ``refresh`` first),
    ``thought_levels`` (what the backend declares for a model) and ``publish`` (a session
    event to the lease's holder)."""

    def __init__(
        self,
        *,
        row: TaskRow,
        guard: LeaseGuard,
        slot: PromptSlot,
        store: TaskStore,
        now_ms: Callable[[], int],
        model_choices: Callable[[bool], Awaitable[ModelChoices]],
        modes: ModeSet,
        thought_levels: Callable[[str | None], tuple[str, ...]],
        publish: Callable[[SessionEvent], None],
        boolean_options: tuple[BooleanOption, ...] = (),
    ) -> None:
        self._row = row
        self._guard = guard
        self._slot = slot
        self._store = store
        self._now_ms = now_ms
        self._model_choices = model_choices
        self._modes = modes
        self._thought_levels = thought_levels
        self._publish = publish
        self._boolean_options = boolean_options
        self._mode = self._restored_mode(row.record)
        #: The thinking-effort levels of the model they were last listed for.
        self._levels: tuple[str | None, tuple[str, ...]] | None = None

    # -- models ------------------------------------------------------------------------------

    async def model_choices(self, refresh: bool) -> ModelChoices:
        with self._guard.operation():
            choices = await self._model_choices(refresh)
            self._guard.check_live()
            return choices

    async def set_model(self, model_id: str, decided: Callable[[], None]) -> TaskRecord:
        with self._guard.operation():
            # A prompt holding the slot whose message is not stored yet decides the lock.
            while self._slot.held and not self._row.model_locked:
                decided()
                await self._slot.wait()
                self._guard.check_live()
            async with self._slot.admission:
                self._guard.check_live()
                if self._row.model_locked:
                    if model_id == self._row.record.model:
                        return self._row.record
                    raise RuntimeRejection(
                        RejectionKind.MODEL_LOCKED,
                        "the model is locked once the session has a message",
                    )
                choices = await self._model_choices(False)
                self._guard.check_live()
                if model_id not in choices:
                    raise RuntimeRejection(
                        RejectionKind.UNKNOWN_MODEL, "the model is not in the catalog"
                    )
                record = self._row.rewritten(
                    await self._store.set_task_model(
                        self._row.record.id, model_id, now_ms=self._now_ms()
                    )
                )
                self._guard.check_live()
                return record

    # -- modes -------------------------------------------------------------------------------

    def _restored_mode(self, task: TaskRecord) -> ModeDeclaration:
        declared = self._modes.get(task.mode)
        if declared is not None:
            return declared
        if task.mode is not None:
            logger.warning(
                "task %s was in session mode %r, which this host no longer offers; "
                "it is in the default mode %s",
                task.id,
                task.mode[:64],
                self._modes.default.mode.id,
            )
        return self._modes.default

    @property
    def modes(self) -> tuple[SessionMode, ...]:
        return self._modes.modes

    @property
    def declaration(self) -> ModeDeclaration:
        """The session's mode with its tool rules (read at every tool decision)."""
        return self._mode

    async def set_mode(self, mode_id: str) -> SessionMode:
        with self._guard.operation():
            declared = self._modes.get(mode_id) if isinstance(mode_id, str) else None
            if declared is None:
                raise RuntimeRejection(
                    RejectionKind.UNKNOWN_MODE, "the session mode is not one this host offers"
                )
            async with self._slot.admission:
                self._guard.check_live()
                if declared is self._mode:
                    return declared.mode
                record = self._row.rewritten(
                    await self._store.set_task_mode(self._row.record.id, declared.mode.id)
                )
                self._mode = declared
                self._publish(ModeChanged(record.id, declared.mode))
                return declared.mode

    # -- thinking effort ---------------------------------------------------------------------

    @property
    def thought_levels(self) -> tuple[str, ...]:
        model = self._row.record.model
        if self._levels is None or self._levels[0] != model:
            self._levels = (model, self._thought_levels(model))
        return self._levels[1]

    @property
    def thought_level(self) -> str | None:
        level = self._row.record.thought_level
        return level if level is not None and level in self.thought_levels else None

    async def set_thought_level(self, level: str | None) -> str | None:
        with self._guard.operation():
            if level is not None and (
                not isinstance(level, str) or level not in self.thought_levels
            ):
                raise RuntimeRejection(
                    RejectionKind.UNKNOWN_THOUGHT_LEVEL,
                    "the thinking effort is not one the session's model offers",
                )
            async with self._slot.admission:
                self._guard.check_live()
                if level == self._row.record.thought_level:
                    return level
                self._row.rewritten(
                    await self._store.set_task_thought_level(self._row.record.id, level)
                )
                return level

    # -- boolean options -----------------------------------------------------------------------

    @property
    def boolean_options(self) -> tuple[BooleanOption, ...]:
        """The options the backend declares, in its order."""
        return self._boolean_options

    @property
    def option_values(self) -> Mapping[str, bool]:
        """Each declared option's value for the task (what it set, else the default)."""
        return option_values(self._boolean_options, self._row.record.boolean_options)

    async def set_boolean_option(self, option_id: str, value: bool) -> bool:
        with self._guard.operation():
            declared = {option.id for option in self._boolean_options}
            if not isinstance(option_id, str) or option_id not in declared:
                raise RuntimeRejection(
                    RejectionKind.INVALID_OPTION, "the option is not one this agent offers"
                )
            if type(value) is not bool:
                raise RuntimeRejection(
                    RejectionKind.INVALID_OPTION, f"the option {option_id} takes true or false"
                )
            async with self._slot.admission:
                self._guard.check_live()
                stored = dict(self._row.record.boolean_options)
                if stored.get(option_id) is value:
                    return value
                stored[option_id] = value
                self._row.rewritten(
                    await self._store.set_task_boolean_options(
                        self._row.record.id, tuple(sorted(stored.items()))
                    )
                )
                return value
