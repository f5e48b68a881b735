"""Where the test suite gets the official ACP JSON schema, fetching it once when it must.

In order: ``$ACP_SCHEMA_DIR`` (the directory holding ``schema.json``, i.e. ``acp-schema/v1``);
``../shared/acp-schema/v1`` beside the checkout; the copy cached in the user's cache directory
(``$XDG_CACHE_HOME/maple-acp``, else ``~/.cache/maple-acp``); else the pinned npm package
``@agentclientprotocol/sdk@2.4.0`` is downloaded from the registry over HTTPS with the standard
library, its sha256 checked against :data:`PACKAGE_SHA256`, and its ``schema/`` folder (``v1``
and ``v2``) cached for the next run.

Resource handling: the download is read into memory (bounded by :data:`MAX_PACKAGE_BYTES`)
and unpacked into a temporary directory beside the cache, which is renamed into place only
once complete, so an interrupted run leaves no half-written cache.

Error handling: every way of not getting the schema (a bad ``ACP_SCHEMA_DIR``, no network, a
package with another hash, a package without the schema) is one :class:`SchemaUnavailable`
line that names ``ACP_SCHEMA_DIR``, the way out when there is no network.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Final

from maple_acp._exceptions import MapleAcpError

__all__ = [
    "PACKAGE_SHA256",
    "PACKAGE_URL",
    "SCHEMA_ENV",
    "SchemaUnavailable",
    "cached_schema_dir",
    "resolve_schema_dir",
    "shared_schema_dir",
]

#: The variable that names the schema directory outright.
SCHEMA_ENV: Final = "ACP_SCHEMA_DIR"
#: The package whose ``schema/`` folder is the ACP schema the suite validates against.
PACKAGE: Final = "@agentclientprotocol/sdk@2.4.0"
PACKAGE_URL: Final = "https://registry.npmjs.org/@agentclientprotocol/sdk/-/sdk-2.4.0.tgz"
#: sha256 of that tarball as the registry serves it: any other bytes are refused.
PACKAGE_SHA256: Final = "87acc66d5824f88d8913702f85cf74c997526bbffb06fce15a9f0d637566ca8d"
#: The tarball is under 1 MiB; a much larger answer is not the package.
MAX_PACKAGE_BYTES: Final = 16 * 1024 * 1024
#: Bounds a stalled download (connect and each read).
FETCH_TIMEOUT_S: Final = 60.0
#: Where the schema files sit inside the npm tarball.
_PACKAGE_SCHEMA_PREFIX: Final = PurePosixPath("package/schema")
#: The versions kept: ``v1`` is what the tests validate against.
_VERSIONS: Final = ("v1", "v2")


class SchemaUnavailable(MapleAcpError):
    """The ACP schema is not on this machine and could not be fetched (one line)."""


def shared_schema_dir() -> Path:
    """``../shared/acp-schema/v1`` beside this checkout."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "acp-schema" / "v1"


def cached_schema_dir(env: Mapping[str, str]) -> Path:
    """The cached copy's ``v1`` directory (it may not exist yet)."""
    base = env.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path(env.get("HOME", "~")).expanduser() / ".cache"
    return root / "maple-acp" / "acp-schema" / "sdk-2.4.0" / "v1"


def _holds_schema(directory: Path) -> bool:
    return (directory / "schema.json").is_file() and (directory / "schema.unstable.json").is_file()


def _way_out(reason: str) -> SchemaUnavailable:
    return SchemaUnavailable(
        f"the ACP schema is needed and {reason}; set {SCHEMA_ENV} to the directory holding "
        f"schema.json (acp-schema/v1, or the schema/v1 folder of {PACKAGE})"
    )


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
            body: bytes = answer.read(MAX_PACKAGE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _way_out(f"fetching {PACKAGE} from {url} failed ({reason})") from None
    if len(body) > MAX_PACKAGE_BYTES:
        raise _way_out(f"{url} answered more than {MAX_PACKAGE_BYTES} bytes")
    return body


def _unpack(package: bytes, into: Path) -> None:
    """Write the package's ``schema/v1`` and ``schema/v2`` JSON files under ``into``; nothing
    else is read, and no member can name a path outside it."""
    with tarfile.open(fileobj=io.BytesIO(package), mode="r:gz") as archive:
        for member in archive.getmembers():
            path = PurePosixPath(member.name)
            if not member.isfile() or path.parent.parent != _PACKAGE_SCHEMA_PREFIX:
                continue
            version, name = path.parent.name, path.name
            if version not in _VERSIONS or not name.endswith(".json") or "/" in name:
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            target = into / version / name
            target.parent.mkdir(mode=0o700, exist_ok=True)
            target.write_bytes(source.read())
    if not _holds_schema(into / "v1"):
        raise _way_out(f"{PACKAGE} holds no schema/v1/schema.json")


def fetch_schema(cache_v1: Path, *, url: str = PACKAGE_URL, sha256: str = PACKAGE_SHA256) -> Path:
    """Download the pinned package, check its hash, and cache its schema; return ``v1``."""
    package = _download(url)
    digest = hashlib.sha256(package).hexdigest()
    if digest != sha256:
        raise _way_out(f"{url} sent a package with sha256 {digest}, not the pinned {sha256}")
    root = cache_v1.parent
    root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".acp-schema-", dir=root.parent))
    try:
        try:
            _unpack(package, staging)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise _way_out(f"{PACKAGE} could not be unpacked ({exc})") from None
        if not root.exists():
            staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cache_v1


def resolve_schema_dir(
    env: Mapping[str, str],
    *,
    shared: Path | None = None,
    cache: Path | None = None,
    url: str = PACKAGE_URL,
    sha256: str = PACKAGE_SHA256,
) -> Path:
    """The ACP v1 schema directory, fetched and cached if need be (see the module docstring);
    raise :class:`SchemaUnavailable` when there is no way to get it."""
    explicit = env.get(SCHEMA_ENV, "")
    if explicit:
        if not _holds_schema(Path(explicit)):
            raise _way_out(f"{SCHEMA_ENV}={explicit} holds no schema.json and schema.unstable.json")
        return Path(explicit)
    for candidate in (
        shared if shared is not None else shared_schema_dir(),
        cache if cache is not None else cached_schema_dir(env),
    ):
        if _holds_schema(candidate):
            return candidate
    return fetch_schema(
        cache if cache is not None else cached_schema_dir(env), url=url, sha256=sha256
    )
