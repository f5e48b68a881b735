"""The registry of engine kinds: what ``kind = "NAME"`` on a ``[[providers]]`` table names.

A kind is an :class:`EngineKind` that a distribution registers under the ``maple_acp.engines``
entry-point group (``[project.entry-points."maple_acp.engines"]`` in its ``pyproject.toml``);
the built-in kinds register the same way, in this project's own ``pyproject.toml``. A kind
reads its own settings (the keys of a provider table the foundation does not know), builds its
engine, and says how its providers list their models. Nothing else in the house names a kind.

The registry is lazy: reading it imports no kind, and a kind's module is imported only when a
configuration names it; a kind imports its SDK only when its engine warms up or turns.

A source checkout that was not reinstalled since a kind was added still finds the built-in
kinds: when this package is imported from a checkout, the checkout's own ``pyproject.toml``
stands in for its distribution's entry points.
"""

from __future__ import annotations

import functools
import logging
import re
import tomllib
from collections.abc import AsyncIterable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar, Final

import attrs

from maple_acp._exceptions import MapleAcpError
from maple_acp.backends.provider._config import ProviderConfig, ProviderEntry
from maple_acp.backends.provider._faults import BACKOFF_S
from maple_acp.backends.provider._http import ProviderKeys, RequestTimeouts, TlsContext
from maple_acp.backends.provider._shell import MAX_TURN_REQUESTS
from maple_acp.runtime import AgentBackend

logger = logging.getLogger(__name__)

#: The entry-point group engine kinds register under.
ENTRY_POINT_GROUP: Final = "maple_acp.engines"
#: This project's distribution, whose registrations a checkout's ``pyproject.toml`` replaces.
_OWN_DISTRIBUTION: Final = "maple-acp"
#: A kind's name is what a user types in ``kind = "..."``: short and plain.
MAX_KIND_NAME_CHARS: Final = 64
_KIND_NAME = re.compile(rf"[a-z0-9][a-z0-9_.-]{{0,{MAX_KIND_NAME_CHARS - 1}}}\Z")


class SettingError(MapleAcpError):
    """A kind's refusal of one of its settings: ``key`` (relative to the provider's table, e.g.
    ``region`` or ``profile.name``) and what is wrong with it, in one line. The foundation
    names the file and the provider in front of it."""

    def __init__(self, key: str, what: str) -> None:
        super().__init__(f"{key}: {what}")
        self.key = key
        self.what = what


class KindUnavailable(MapleAcpError):
    """A kind the configuration names cannot be used: it is not registered, registered twice,
    or its module fails to load. The message is one line naming it (and the known kinds)."""


@attrs.frozen(kw_only=True)
class EngineOptions:
    """What ``build_backend`` passes every kind's engine: the request bounds, the request limit
    of a turn and the retry waits (the keyword arguments ``ProviderEngine`` takes)."""

    timeouts: RequestTimeouts | None = None
    max_turn_requests: int = MAX_TURN_REQUESTS
    backoff: tuple[float, ...] = BACKOFF_S

    def shell(self) -> dict[str, Any]:
        """The keyword arguments of ``ProviderEngine.__init__``."""
        return {
            "timeouts": self.timeouts,
            "max_turn_requests": self.max_turn_requests,
            "backoff": self.backoff,
        }


class ModelListing:
    """How one kind's providers list their models, for the catalog's discovery and the
    start-up check.

    Error handling: :meth:`open_models` lets the provider's failure propagate; an exception
    with a ``status_code`` (as the SDKs raise) is read as an HTTP status."""

    async def ready(self) -> None:
        """Import what listing needs (its SDK), in a worker thread; called before each use,
        so it must be cheap once done."""

    def open_models(
        self, entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext
    ) -> AbstractAsyncContextManager[AsyncIterable[object]]:
        """The model ids ``entry`` lists (anything but a non-blank string is skipped); its
        connections close when the block ends."""
        raise NotImplementedError


@attrs.frozen
class BuiltEngine:
    """What a kind builds for a configuration: the engine that runs its providers' turns, and
    how they list their models (``None``: they do not, and each needs a ``models`` list)."""

    backend: AgentBackend
    listing: ModelListing | None = None


class EngineKind:
    """One kind of engine. Subclass it, set the class attributes, write :meth:`build` (and
    :meth:`settings` when the kind has settings of its own, :meth:`listing` when its
    providers list their models), and register an instance (or the class) under
    :data:`ENTRY_POINT_GROUP` with the kind's name as the entry point's name."""

    #: What ``kind = "..."`` names; the same as the entry point's name.
    name: ClassVar[str]
    #: How messages call it ("the OpenAI-compatible provider needs ...").
    title: ClassVar[str] = ""
    #: Import names that must be installed to use it (checked, never imported, at start).
    requires: ClassVar[tuple[str, ...]] = ()
    #: The command that installs them.
    install: ClassVar[str] = ""

    def settings(self, extra: Mapping[str, Any]) -> Any:
        """The kind's own settings read from ``extra`` (the keys of a provider's table the
        foundation does not know), as one value the engine finds on
        ``ProviderEntry.kind_settings``. Raise :class:`SettingError` naming the key for a bad
        one. By default a kind has none, and any key is refused."""
        for key in sorted(extra):
            raise SettingError(key[:64], "is not a provider setting")
        return None

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        """The engine serving the providers of this kind in ``config``. Import no SDK here."""
        raise NotImplementedError

    def listing(self) -> ModelListing | None:
        """How this kind's providers list their models, on its own (the start-up check of a
        single provider); ``None``: they do not."""
        return None

    @property
    def display_name(self) -> str:
        return self.title or self.name


@attrs.frozen
class Registration:
    """One entry point: a kind's name, the object it names (``module:attribute``) and the
    distribution that registered it."""

    name: str
    value: str
    distribution: str


class EngineKinds:
    """The registered kinds, loaded one by one as configurations name them.

    Error handling: :meth:`get` raises :class:`KindUnavailable` with one line for a name that
    is not registered (naming the known ones), registered twice to different objects, or
    whose module fails to load or names no ``EngineKind``."""

    def __init__(self, registrations: Iterable[Registration]) -> None:
        self._registered: dict[str, list[Registration]] = {}
        for registration in registrations:
            found = self._registered.setdefault(registration.name, [])
            if all(other.value != registration.value for other in found):
                found.append(registration)
        self._loaded: dict[str, EngineKind] = {}

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._registered))

    def known(self) -> str:
        """The known kinds, for a message."""
        return ", ".join(map(repr, self.names())) or "none"

    def get(self, name: str) -> EngineKind:
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        found = self._registered.get(name)
        if not found:
            raise KindUnavailable(
                f"is not an installed engine kind (installed: {self.known()}); install the "
                "package that provides it"
            )
        if len(found) > 1:
            by = " and ".join(f"{each.distribution} ({each.value})" for each in found[:2])
            raise KindUnavailable(f"{name!r} is registered twice, by {by}")
        (registration,) = found
        kind = self._load(registration)
        self._loaded[name] = kind
        return kind

    @staticmethod
    def _load(registration: Registration) -> EngineKind:
        import importlib.metadata

        named = f"{registration.name!r} ({registration.distribution}: {registration.value})"
        point = importlib.metadata.EntryPoint(
            registration.name, registration.value, ENTRY_POINT_GROUP
        )
        try:
            target: Any = point.load()
        except Exception as exc:
            raise KindUnavailable(
                f"the engine kind {named} could not be loaded: {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(target, type) and issubclass(target, EngineKind):
            target = target()
        if not isinstance(target, EngineKind):
            raise KindUnavailable(f"the engine kind {named} is not an EngineKind")
        if target.name != registration.name:
            raise KindUnavailable(f"the engine kind {named} calls itself {target.name!r}")
        return target


@functools.cache
def installed_kinds() -> EngineKinds:
    """The kinds installed with this interpreter (read once per process)."""
    return EngineKinds(installed_registrations())


def installed_registrations() -> list[Registration]:
    """The ``maple_acp.engines`` entry points of every installed distribution; this project's
    own are read from its checkout's ``pyproject.toml`` when the package runs from one."""
    import importlib.metadata

    checkout = checkout_registrations(Path(__file__).resolve().parents[3])
    found: list[Registration] = list(checkout or ())
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        distribution = point.dist.name if point.dist is not None else "?"
        if checkout is not None and _normalized(distribution) == _OWN_DISTRIBUTION:
            continue
        found.append(Registration(point.name, point.value, distribution))
    kept = []
    for each in found:
        if _KIND_NAME.match(each.name):
            kept.append(each)
        else:
            logger.warning(
                "ignoring the engine kind %r of %s: a kind's name is lower-case letters, "
                "digits, '.', '_' or '-'",
                each.name[:80],
                each.distribution,
            )
    return kept


def checkout_registrations(root: Path) -> list[Registration] | None:
    """This project's registrations from ``root/pyproject.toml`` when ``root`` is its source
    checkout; ``None`` when it is not (an installed package has no ``pyproject.toml`` beside
    it)."""
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        if _normalized(project["name"]) != _OWN_DISTRIBUTION:
            return None
        table = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
        return [
            Registration(str(name), str(value), project["name"]) for name, value in table.items()
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()
