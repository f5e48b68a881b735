"""How attribute names become wire keys: camelCase, and ``meta`` is ACP's ``_meta``."""

import functools


@functools.cache
def wire_key(attribute_name: str) -> str:
    if attribute_name == "meta":
        return "_meta"
    head, *rest = attribute_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)
