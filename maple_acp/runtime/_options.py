"""Boolean options a backend declares for its sessions (a switch a client shows as a toggle,
e.g. the demo's ``brief``): what a declaration is, and the bounds on what a backend lists.

A task stores only the options set for it (``TaskRecord.boolean_options``); an option it never
set has the backend's default. :class:`SessionSettings` (``_lease_settings``) sets and reads
them; a turn reads them through ``Turn.boolean_option``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

logger = logging.getLogger(__name__)

#: Boolean options one backend may declare: a client shows each as a toggle beside the model,
#: mode and thinking effort, so a handful is already a crowded panel.
MAX_BOOLEAN_OPTIONS: Final = 16
#: An option's id, at most (a config option id on the wire).
MAX_OPTION_ID_CHARS: Final = 64
#: An option's name and description, at most (a client shows them as one label and one line).
MAX_OPTION_TEXT_CHARS: Final = 200


@attrs.frozen(kw_only=True)
class BooleanOption:
    """One on/off option a backend offers for every session: ``id`` (what a client sets),
    ``name`` and ``description`` (what it shows), and its value for a task that never set
    it."""

    id: str
    name: str
    description: str = ""
    default: bool = False


def _plain(text: str, limit: int) -> bool:
    return isinstance(text, str) and len(text) <= limit and text.isprintable()


def _well_formed(option: BooleanOption) -> bool:
    return bool(
        _plain(option.id, MAX_OPTION_ID_CHARS)
        and option.id
        and all(c.isalnum() or c in "_-." for c in option.id)
        and _plain(option.name, MAX_OPTION_TEXT_CHARS)
        and option.name.strip()
        and _plain(option.description, MAX_OPTION_TEXT_CHARS)
        and type(option.default) is bool
    )


def checked_boolean_options(declared: Sequence[object]) -> tuple[BooleanOption, ...]:
    """The options a backend listed, or none when the list breaks a bound (too many, an id
    that is empty, long, not a plain word or repeated, a name or description that is not one
    short line, a default that is not a bool): an option half-declared is not offered."""
    options: dict[str, BooleanOption] = {}
    for option in declared:
        if (
            not isinstance(option, BooleanOption)
            or not _well_formed(option)
            or option.id in options
            or len(options) >= MAX_BOOLEAN_OPTIONS
        ):
            logger.warning("the agent backend listed malformed boolean options; none are offered")
            return ()
        options[option.id] = option
    return tuple(options.values())


def option_values(
    declared: Sequence[BooleanOption], stored: Sequence[tuple[str, bool]]
) -> Mapping[str, bool]:
    """Each declared option's value for a task: what it stored, else the default (a stored
    value of an option no longer declared is ignored)."""
    kept = dict(stored)
    return {option.id: kept.get(option.id, option.default) for option in declared}
