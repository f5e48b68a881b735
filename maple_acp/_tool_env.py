"""What a tool child's environment is made of: the one rule for every process the runtime
starts on a model's behalf (the shell tool today).

A child gets the host's values of an allow-list of names (enough for a shell to find programs,
its home, its locale and its temporary directory), the names a host adds with
``tool_env_allow``, and the session's relay values. Nothing else of the host's environment
reaches it: not a provider's API key, not maple-acp's own ``MAPLE_ACP_*`` settings. The host's
``os.environ`` is only read, never changed.

Private, pure and below every layer: the runtime builds environments with it and the config
file's checks use it, while ``maple_acp.config`` still imports no ``trio``.

Error handling: :func:`check_tool_env_allow` raises ``ValueError`` with one line naming the
offending variable (never a value); the callers wrap it in their own error (a config-file line,
``AgentService``'s ``ValueError``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final

#: Names every tool child inherits from the host when set there: a shell needs them to find
#: programs, its home and user, its locale and its temporary directory.
INHERITED_ENV_NAMES: Final = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "TZ"}
)
#: Name prefixes every tool child inherits (the locale categories).
INHERITED_ENV_PREFIXES: Final = ("LC_",)
#: maple-acp's own settings: never passed to a tool, whatever a host allows.
HOST_SETTINGS_PREFIX: Final = "MAPLE_ACP_"
#: A host's additions; a longer list is a mistake (a whole environment pasted in).
MAX_TOOL_ENV_NAMES: Final = 64

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def inherited_by_tools(name: str, allowed: Collection[str] = ()) -> bool:
    """Whether a tool child gets the host's value of ``name`` (``allowed``: the host's
    ``tool_env_allow``)."""
    if name.startswith(HOST_SETTINGS_PREFIX):
        return False
    return name in INHERITED_ENV_NAMES or name.startswith(INHERITED_ENV_PREFIXES) or name in allowed


def tool_child_environment(
    host: Mapping[str, str], relay: Mapping[str, str], allowed: Collection[str] = ()
) -> dict[str, str]:
    """The environment of a child started for a tool: the host's values of the inherited
    names and of ``allowed``, then ``relay`` (the session's values, by name) over them."""
    env = {name: value for name, value in host.items() if inherited_by_tools(name, allowed)}
    env.update(
        (name, value) for name, value in relay.items() if not name.startswith(HOST_SETTINGS_PREFIX)
    )
    return env


def check_tool_env_allow(names: Any, key_names: Collection[str] = ()) -> tuple[str, ...]:
    """A host's ``tool_env_allow`` as given (duplicates dropped), or ``ValueError`` saying
    what is wrong: not a list of environment variable names, a ``MAPLE_ACP_*`` name, or one of
    ``key_names`` (the variables holding a provider's API key)."""
    if not isinstance(names, list | tuple | frozenset | set):
        raise ValueError("must be a list of environment variable names")
    checked: dict[str, None] = {}
    for name in names:
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if name.startswith(HOST_SETTINGS_PREFIX):
            raise ValueError(
                f"{name} is a maple-acp setting; {HOST_SETTINGS_PREFIX}* never reach tools"
            )
        if name in key_names:
            raise ValueError(f"{name} holds a provider's API key, which never reaches tools")
        checked[name] = None
    if len(checked) > MAX_TOOL_ENV_NAMES:
        raise ValueError(f"at most {MAX_TOOL_ENV_NAMES} names")
    return tuple(checked)
