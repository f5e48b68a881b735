"""Every public wire type, found from the package's exports (shared by the wire tests)."""

import types
import typing
from typing import Any

import attrs

from maple_acp import wire


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


WIRE_CLASSES: list[type[Any]] = sorted(
    (
        getattr(wire, name)
        for name in wire.__all__
        if isinstance(getattr(wire, name), type)
        and attrs.has(getattr(wire, name))
        and name != "MethodSpec"
    ),
    key=lambda cls: cls.__name__,
)

#: The union aliases whose members are told apart by a tag or by shape.
WIRE_UNIONS: dict[str, Any] = {
    name: getattr(wire, name)
    for name in sorted(wire.__all__)
    if _is_union(getattr(wire, name))
    and all(isinstance(a, type) and attrs.has(a) for a in typing.get_args(getattr(wire, name)))
}
