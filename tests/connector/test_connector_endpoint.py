"""Endpoint identity, the private directory and the socket checks, from both ends."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from connector_harness import TIMEOUT, Client, Host, connector_env, read_line, run_connector

from maple_acp_connector.endpoint import (
    EndpointUnavailable,
    UnsafeDirectory,
    UnsafeEndpoint,
    check_endpoint_socket,
    check_private_dir,
    endpoint_path,
    ensure_private_dir,
    installation_location,
    resolve_endpoint,
)

StartClient = Callable[..., Client]
OTHER_UID = 65534  # "nobody" on Linux and macOS alike
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root can make a file owned by another user"
)
NAME = re.compile(r"maple-acp-[0-9a-f]{16}\.sock")


def private_runtime_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


# -- identity ---------------------------------------------------------------------------------


def test_identity_is_deterministic_and_short(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(private_runtime_dir(tmp_path / "run"))}
    first = endpoint_path(env=env)
    assert first == endpoint_path(env=env)
    assert NAME.fullmatch(first.name)


def test_identity_differs_by_installation_and_app_id(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(private_runtime_dir(tmp_path / "run"))}
    names = {
        endpoint_path(installation="/opt/app/venv\0/opt/app/pkg", env=env).name,
        endpoint_path(installation="/home/dev/venv\0/home/dev/src/pkg", env=env).name,
        endpoint_path("other-app", installation="/opt/app/venv\0/opt/app/pkg", env=env).name,
        endpoint_path(env=env).name,
    }
    assert len(names) == 4


def test_installation_location_names_prefix_and_package_dir() -> None:
    import maple_acp_connector

    prefix, package_dir = installation_location().split("\0")
    assert prefix == os.path.realpath(sys.prefix)
    assert package_dir == os.path.realpath(os.path.dirname(maple_acp_connector.__file__))


def test_empty_app_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="app_id"):
        endpoint_path("")


# -- location ---------------------------------------------------------------------------------


def test_usable_runtime_dir_holds_the_socket(tmp_path: Path) -> None:
    runtime = private_runtime_dir(tmp_path / "run")
    assert endpoint_path(env={"XDG_RUNTIME_DIR": str(runtime)}).parent == runtime


@pytest.mark.parametrize("problem", ["group-readable", "missing", "relative", "a file"])
def test_unusable_runtime_dir_falls_back_to_private_temp_dir(tmp_path: Path, problem: str) -> None:
    runtime = tmp_path / "run"
    if problem == "group-readable":
        private_runtime_dir(runtime).chmod(0o750)
        value = str(runtime)
    elif problem == "missing":
        value = str(runtime)
    elif problem == "relative":
        value = "run"
    else:
        runtime.write_text("")
        value = str(runtime)
    temp = tmp_path / "tmp"
    temp.mkdir()
    path = endpoint_path(env={"XDG_RUNTIME_DIR": value, "TMPDIR": str(temp)})
    assert path.parent == temp / f"maple-acp-{os.geteuid()}"
    assert NAME.fullmatch(path.name)


def test_temp_dir_defaults_to_tmp_when_tmpdir_is_unusable() -> None:
    path = endpoint_path(env={"TMPDIR": "/nonexistent-dir-for-maple-acp"})
    assert path.parent == Path("/tmp") / f"maple-acp-{os.geteuid()}"


def test_endpoint_path_creates_nothing(tmp_path: Path) -> None:
    endpoint_path(env={"TMPDIR": str(tmp_path)})
    assert list(tmp_path.iterdir()) == []


def test_override_precedence(tmp_path: Path) -> None:
    env = {"MAPLE_ACP_SOCKET": "/run/from-env.sock", "TMPDIR": str(tmp_path)}
    assert resolve_endpoint("/run/from-cli.sock", env) == Path("/run/from-cli.sock")
    assert resolve_endpoint(None, env) == Path("/run/from-env.sock")
    # Empty values count as unset.
    assert resolve_endpoint("", env) == Path("/run/from-env.sock")
    default = endpoint_path(env={"TMPDIR": str(tmp_path)})
    assert resolve_endpoint(None, {"MAPLE_ACP_SOCKET": "", "TMPDIR": str(tmp_path)}) == default
    assert resolve_endpoint(None, {"TMPDIR": str(tmp_path)}) == default


def test_relative_override_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_endpoint("here.sock", {}) == tmp_path / "here.sock"


def test_connector_finds_host_on_default_endpoint(
    tmp_path: Path, short_dir: Path, start_client: StartClient
) -> None:
    """The host's endpoint_path() and a connector subprocess agree on the default endpoint."""
    env = connector_env(TMPDIR=str(short_dir))
    env.pop("XDG_RUNTIME_DIR", None)
    path = endpoint_path(env=env)
    ensure_private_dir(path.parent)
    host = Host(path)
    try:
        client = start_client(env=env)
        conn = host.accept()
        client.write(b"found\n")
        assert read_line(conn) == b"found\n"
        conn.close()
        assert client.read_all() == b""
    finally:
        host.close()


# -- the private directory --------------------------------------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_private_dir_is_created_0700(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "maple-acp-test"
    ensure_private_dir(target)
    assert target.stat().st_mode & 0o777 == 0o700
    ensure_private_dir(target)  # an existing private directory is accepted as is


def test_private_dir_refuses_group_writable(tmp_path: Path) -> None:
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(0o770)
    with pytest.raises(UnsafeDirectory, match="mode 0770"):
        ensure_private_dir(target)
    assert target.stat().st_mode & 0o777 == 0o770  # refused, never repaired


def test_private_dir_refuses_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        ensure_private_dir(link)


def test_private_dir_refuses_non_directory(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        check_private_dir(target)


@needs_root
def test_private_dir_refuses_other_owner(tmp_path: Path) -> None:
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    os.chown(target, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectory, match=f"owned by uid {OTHER_UID}"):
        ensure_private_dir(target)


def test_connector_refuses_open_default_directory(short_dir: Path) -> None:
    env = connector_env(TMPDIR=str(short_dir))
    env.pop("XDG_RUNTIME_DIR", None)
    path = endpoint_path(env=env)
    path.parent.mkdir(mode=0o700)
    path.parent.chmod(0o777)
    host = Host(path)
    try:
        result = run_connector(env=env)
        assert not host.has_pending_connection()
    finally:
        host.close()
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (
        f"maple-acp: refusing the socket directory {path.parent}: "
        "its mode 0777 grants access to group or others\n"
    )


# -- the socket checks ------------------------------------------------------------------------


def assert_refused(result: subprocess.CompletedProcess[bytes], message: str) -> None:
    assert result.returncode == 1
    assert result.stdout == b""
    stderr = result.stderr.decode()
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith("maple-acp: ")
    assert message in stderr


def test_symlink_to_a_real_socket_is_refused(host: Host, short_dir: Path) -> None:
    link = short_dir / "link.sock"
    link.symlink_to(host.path)
    with pytest.raises(UnsafeEndpoint, match="symbolic link"):
        check_endpoint_socket(link)
    result = run_connector("--socket", str(link))
    assert_refused(result, f"refusing the endpoint {link}: it is a symbolic link")
    assert not host.has_pending_connection()


def test_regular_file_is_refused(short_dir: Path) -> None:
    path = short_dir / "plain.sock"
    path.write_bytes(b"")
    path.chmod(0o600)
    assert_refused(run_connector("--socket", str(path)), "it is a regular file, not a socket")


@pytest.mark.parametrize("mode", [0o660, 0o604, 0o700])
def test_socket_with_group_or_other_bits_is_refused(host: Host, mode: int) -> None:
    os.chmod(host.path, mode)
    if mode & 0o077:
        assert_refused(
            run_connector("--socket", str(host.path)),
            f"its mode {mode:04o} grants access to group or others",
        )
        assert not host.has_pending_connection()
    else:
        check_endpoint_socket(host.path)  # owner bits alone are fine


@needs_root
def test_socket_of_another_user_is_refused(host: Host) -> None:
    os.chown(host.path, OTHER_UID, OTHER_UID)
    assert_refused(run_connector("--socket", str(host.path)), f"it is owned by uid {OTHER_UID}")
    assert not host.has_pending_connection()


@needs_root
def test_listener_running_as_another_user_is_refused(short_dir: Path) -> None:
    """The socket file is ours, but the process that listens on it is not (peer credentials)."""
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("peer credentials are checked on Linux only")
    path = short_dir / "impostor.sock"
    listener = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, socket, sys
                s = socket.socket(socket.AF_UNIX)
                s.bind({str(path)!r})
                os.chmod({str(path)!r}, 0o600)
                os.setuid({OTHER_UID})
                s.listen()
                print("listening", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline() == b"listening\n"
        check_endpoint_socket(path)  # the file itself passes
        assert_refused(
            run_connector("--socket", str(path)),
            f"the process listening there runs as uid {OTHER_UID}",
        )
    finally:
        listener.kill()
        listener.wait(TIMEOUT)
        for stream in (listener.stdin, listener.stdout):
            if stream is not None:
                stream.close()


# -- no host ----------------------------------------------------------------------------------


def test_missing_socket_means_unavailable(short_dir: Path) -> None:
    path = short_dir / "absent.sock"
    with pytest.raises(EndpointUnavailable):
        check_endpoint_socket(path)
    result = run_connector("--socket", str(path), stdin=b'{"jsonrpc":"2.0"}\n')
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (
        f"maple-acp: the maple-acp service is unavailable at {path}: "
        "no socket there (is the host running?)\n"
    )
    assert not path.exists()  # nothing was started or created


def test_stale_socket_means_unavailable(short_dir: Path) -> None:
    stale = Host(short_dir / "stale.sock")
    stale.close()  # the file stays, nobody listens
    result = run_connector("--socket", str(stale.path))
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (
        f"maple-acp: the maple-acp service is unavailable at {stale.path}: "
        "connection refused (no service is listening; is the host running?)\n"
    )


def test_default_endpoint_without_host_is_unavailable(short_dir: Path) -> None:
    env = connector_env(TMPDIR=str(short_dir))
    env.pop("XDG_RUNTIME_DIR", None)
    result = run_connector(env=env)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (
        f"maple-acp: the maple-acp service is unavailable at {endpoint_path(env=env)}: "
        "no socket there (is the host running?)\n"
    )
    assert list(short_dir.iterdir()) == []  # the connector creates no directory


def test_unprintable_path_stays_on_one_line(short_dir: Path) -> None:
    path = short_dir / "evil\nmaple-acp: forged.sock"
    result = run_connector("--socket", str(path))
    assert result.returncode == 1
    assert result.stderr.decode().count("\n") == 1
