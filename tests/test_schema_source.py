"""The suite finds its ACP schema by itself: ACP_SCHEMA_DIR, else the schema folder beside the
checkout, else the cached copy, else the pinned npm package over HTTPS, checked against its
sha256; every way of failing is one line naming ACP_SCHEMA_DIR. The registry is a loopback
HTTP server here."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import shutil
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from maple_acp.testing.schema import AcpSchema
from maple_acp.testing.schema_source import SchemaUnavailable, resolve_schema_dir

SCHEMA = b'{"$defs": {}}'


def _package(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


GOOD = _package(
    {
        "package/package.json": b"{}",
        "package/schema/v1/schema.json": SCHEMA,
        "package/schema/v1/schema.unstable.json": SCHEMA,
        "package/schema/v2/schema.json": SCHEMA,
        "package/schema/../../escaped.json": b"{}",
        "package/dist/v1/schema/index.js": b"",
    }
)


class _Registry(http.server.BaseHTTPRequestHandler):
    body = b""
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[type[_Registry]]:
    handler = type("Registry", (_Registry,), {"body": GOOD, "hits": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/sdk-2.4.0.tgz"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/sdk-2.4.0.tgz"


def test_the_pinned_package_is_fetched_once_checked_and_cached(
    tmp_path: Path, registry: type[_Registry]
) -> None:
    cache = tmp_path / "cache" / "v1"
    where = {"shared": tmp_path / "no-shared", "cache": cache}
    pinned = hashlib.sha256(GOOD).hexdigest()
    url = registry.url  # type: ignore[attr-defined]
    assert resolve_schema_dir({}, url=url, sha256=pinned, **where) == cache
    assert (cache / "schema.json").read_bytes() == SCHEMA
    assert (cache.parent / "v2" / "schema.json").read_bytes() == SCHEMA
    assert sorted(p.name for p in cache.parent.iterdir()) == ["v1", "v2"]
    assert not (tmp_path / "escaped.json").exists()
    # The next run reads the cache: the registry is not asked again (here: it is gone).
    assert resolve_schema_dir({}, url=_closed_port_url(), sha256=pinned, **where) == cache
    assert registry.hits == 1


def test_a_package_with_another_hash_is_refused_and_not_cached(
    tmp_path: Path, registry: type[_Registry]
) -> None:
    cache = tmp_path / "cache" / "v1"
    with pytest.raises(SchemaUnavailable) as caught:
        resolve_schema_dir(
            {},
            shared=tmp_path / "no-shared",
            cache=cache,
            url=registry.url,  # type: ignore[attr-defined]
            sha256="0" * 64,
        )
    message = str(caught.value)
    assert "not the pinned " + "0" * 64 in message
    assert "set ACP_SCHEMA_DIR" in message
    assert "\n" not in message
    assert not cache.parent.exists()
    assert [p for p in cache.parent.parent.iterdir() if p.name.startswith(".")] == []


def test_no_way_to_get_the_schema_is_one_line_naming_acp_schema_dir(tmp_path: Path) -> None:
    # tests/conftest.py turns this into a usage error (tests/test_docs.py runs that).
    with pytest.raises(SchemaUnavailable) as caught:
        resolve_schema_dir(
            {},
            shared=tmp_path / "no-shared",
            cache=tmp_path / "cache" / "v1",
            url=_closed_port_url(),
        )
    message = str(caught.value)
    assert message.startswith("the ACP schema is needed and fetching @agentclientprotocol/sdk")
    assert "set ACP_SCHEMA_DIR to the directory holding schema.json" in message
    assert "\n" not in message


def test_acp_schema_dir_wins_and_a_wrong_one_is_one_line(tmp_path: Path) -> None:
    chosen = tmp_path / "mine"
    chosen.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    for directory in (chosen, shared):
        (directory / "schema.json").write_bytes(SCHEMA)
        (directory / "schema.unstable.json").write_bytes(SCHEMA)
    where = {"shared": shared, "cache": tmp_path / "cache" / "v1", "url": _closed_port_url()}
    assert resolve_schema_dir({"ACP_SCHEMA_DIR": str(chosen)}, **where) == chosen  # type: ignore[arg-type]
    assert resolve_schema_dir({}, **where) == shared  # type: ignore[arg-type]
    with pytest.raises(SchemaUnavailable, match=r"ACP_SCHEMA_DIR=\S+/nothing holds no schema"):
        resolve_schema_dir({"ACP_SCHEMA_DIR": str(tmp_path / "nothing")}, **where)  # type: ignore[arg-type]


def test_a_fetched_schema_without_meta_files_still_knows_its_version(tmp_path: Path) -> None:
    """The npm package's ``schema/`` folder has no ``meta.json``: v1 and v2 are told apart by
    their own definitions, so the v2 tests validate against v2 from a fetched copy too."""
    resolved = Path(os.environ["ACP_SCHEMA_DIR"])
    for version in ("v1", "v2"):
        copy = tmp_path / version
        copy.mkdir()
        for name in ("schema.json", "schema.unstable.json"):
            shutil.copyfile(resolved.parent / version / name, copy / name)
    assert AcpSchema(tmp_path / "v1").version == 1
    assert AcpSchema(tmp_path / "v2").version == 2
