"""Native file tools a backend may offer its model: paths resolved inside the session root,
bounded reads, and writes and edits that report what changed as a ``FileDiff``.

A path is taken relative to the root (or absolute), every symlink is followed, and the result
must still lie inside the root's own real path; anything else is a ``FileToolError`` whose
text is safe to show the model and the caller. This is the host's policy for its own tools,
not a sandbox: a process running as the same user can change the tree between the check and
the use, which is why the final open refuses to follow a symlink that appeared meanwhile.

The functions are synchronous (plain file I/O); a backend calls the ``*_async`` forms, which
run them on a worker thread.
"""

from __future__ import annotations

import errno
import os
import stat

import attrs
import trio

from maple_acp._exceptions import MapleAcpError
from maple_acp.model import FileDiff, ToolLocation

#: A file read returns at most this much text; a model asking for more gets a marked cut.
MAX_READ_CHARS = 256 * 1024
#: A file larger than this is not read at all (its first bytes would be a poor answer).
MAX_FILE_BYTES = 8 * 1024 * 1024
#: Text a write or edit may produce: a tool call is not the way to write huge files.
MAX_WRITE_CHARS = 4 * 1024 * 1024
#: Each side of a diff kept for the caller's view; the file itself keeps all of it.
MAX_DIFF_CHARS = 64 * 1024

# O_NONBLOCK: opening a FIFO someone put in the tree must not hang the tool.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | _OPEN_FLAGS
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | _OPEN_FLAGS


class FileToolError(MapleAcpError):
    """A file tool call that cannot be done; ``str(exc)`` is one safe line."""


@attrs.frozen(kw_only=True)
class FileRead:
    path: str
    text: str
    #: The file had more than ``MAX_READ_CHARS`` characters (or more than asked for).
    truncated: bool


@attrs.frozen(kw_only=True)
class FileChange:
    """What a write or an edit did to one file (whole texts, unbounded)."""

    path: str
    #: ``None`` when the file did not exist.
    old_text: str | None
    new_text: str
    #: 1-based line where the change starts (for the caller's location).
    line: int | None = None

    def diff(self) -> FileDiff:
        """The change as a bounded ``FileDiff`` (each side cut to ``MAX_DIFF_CHARS``)."""
        old, new = self.old_text, self.new_text
        truncated = len(new) > MAX_DIFF_CHARS or (old is not None and len(old) > MAX_DIFF_CHARS)
        return FileDiff(
            path=self.path,
            new_text=new[:MAX_DIFF_CHARS],
            old_text=None if old is None else old[:MAX_DIFF_CHARS],
            truncated=truncated,
        )

    def location(self) -> ToolLocation:
        return ToolLocation(path=self.path, line=self.line)


def resolve_in_root(root: str, path: str) -> str:
    """The real absolute path ``path`` names, which must lie inside ``root``.

    ``path`` is relative to ``root`` or absolute; symlinks are followed (also in the part that
    does not exist yet, as far as it exists). Raises ``FileToolError``."""
    if not isinstance(path, str) or not path.strip():
        raise FileToolError("a file path is required")
    if "\x00" in path:
        raise FileToolError("a file path cannot contain NUL")
    real_root = os.path.realpath(root)
    joined = os.path.join(real_root, os.path.expanduser(path) if path.startswith("~") else path)
    resolved = os.path.realpath(joined)
    if not _inside(real_root, resolved):
        raise FileToolError(f"{_shown(path)} is outside the session's project directory")
    return resolved


def read_text(root: str, path: str, *, max_chars: int = MAX_READ_CHARS) -> FileRead:
    """Read a UTF-8 text file inside ``root``, at most ``max_chars`` characters of it."""
    resolved = resolve_in_root(root, path)
    text = _read_existing(resolved, path)
    if text is None:
        raise FileToolError(f"{_shown(path)} does not exist")
    limit = max(0, min(max_chars, MAX_READ_CHARS))
    return FileRead(path=resolved, text=text[:limit], truncated=len(text) > limit)


def write_text(root: str, path: str, content: str, *, dry_run: bool = False) -> FileChange:
    """Create or replace a text file inside ``root`` (creating missing parent directories
    inside it too). ``dry_run`` checks everything and returns the change without making it,
    so a caller can show the diff before asking."""
    if not isinstance(content, str):
        raise FileToolError("the file content must be text")
    if len(content) > MAX_WRITE_CHARS:
        raise FileToolError(f"a file written by a tool is limited to {MAX_WRITE_CHARS} characters")
    resolved = resolve_in_root(root, path)
    old = _read_existing(resolved, path)
    change = FileChange(
        path=resolved, old_text=old, new_text=content, line=_first_changed_line(old, content)
    )
    if dry_run:
        return change
    parent = os.path.dirname(resolved)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise FileToolError(
            f"cannot create the directory of {_shown(path)}: {_reason(exc)}"
        ) from None
    # A directory created just now could be a symlink swapped in by someone else: check again.
    if os.path.realpath(parent) != parent or not _inside(os.path.realpath(root), parent):
        raise FileToolError(f"{_shown(path)} is outside the session's project directory")
    _write(resolved, path, content)
    return change


def edit_text(
    root: str, path: str, old_text: str, new_text: str, *, dry_run: bool = False
) -> FileChange:
    """Replace the one occurrence of ``old_text`` in an existing text file inside ``root``
    (``dry_run``: as for ``write_text``)."""
    if not isinstance(old_text, str) or not isinstance(new_text, str):
        raise FileToolError("old_text and new_text must be text")
    if not old_text:
        raise FileToolError("old_text must not be empty")
    resolved = resolve_in_root(root, path)
    current = _read_existing(resolved, path)
    if current is None:
        raise FileToolError(f"{_shown(path)} does not exist")
    count = current.count(old_text)
    if count == 0:
        raise FileToolError(f"old_text was not found in {_shown(path)}")
    if count > 1:
        raise FileToolError(
            f"old_text occurs {count} times in {_shown(path)}; include more context to pick one"
        )
    at = current.index(old_text)
    updated = current[:at] + new_text + current[at + len(old_text) :]
    if len(updated) > MAX_WRITE_CHARS:
        raise FileToolError(f"a file written by a tool is limited to {MAX_WRITE_CHARS} characters")
    if not dry_run:
        _write(resolved, path, updated)
    return FileChange(
        path=resolved, old_text=current, new_text=updated, line=current.count("\n", 0, at) + 1
    )


async def read_text_async(root: str, path: str, *, max_chars: int = MAX_READ_CHARS) -> FileRead:
    return await trio.to_thread.run_sync(lambda: read_text(root, path, max_chars=max_chars))


async def write_text_async(
    root: str, path: str, content: str, *, dry_run: bool = False
) -> FileChange:
    return await trio.to_thread.run_sync(lambda: write_text(root, path, content, dry_run=dry_run))


async def edit_text_async(
    root: str, path: str, old_text: str, new_text: str, *, dry_run: bool = False
) -> FileChange:
    return await trio.to_thread.run_sync(
        lambda: edit_text(root, path, old_text, new_text, dry_run=dry_run)
    )


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_existing(resolved: str, shown: str) -> str | None:
    """The file's text, ``None`` when it does not exist."""
    try:
        fd = os.open(resolved, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FileToolError(f"cannot open {_shown(shown)}: {_reason(exc)}") from None
    _require_regular(fd, shown)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise FileToolError(f"{_shown(shown)} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileToolError(f"{_shown(shown)} is not UTF-8 text") from None


def _write(resolved: str, shown: str, content: str) -> None:
    try:
        fd = os.open(resolved, _WRITE_FLAGS, 0o666)
    except OSError as exc:
        raise FileToolError(f"cannot write {_shown(shown)}: {_reason(exc)}") from None
    _require_regular(fd, shown)
    with os.fdopen(fd, "wb") as handle:
        # Truncated only now that it is known to be a regular file.
        handle.truncate(0)
        handle.write(content.encode("utf-8"))


def _require_regular(fd: int, shown: str) -> None:
    """Close ``fd`` and refuse unless it is a regular file (not a directory, FIFO or device)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileToolError(f"{_shown(shown)} is not a regular file")


def _first_changed_line(old: str | None, new: str) -> int:
    if old is None:
        return 1
    common = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        common += 1
    return new.count("\n", 0, common) + 1


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a symlink that appeared after the path was checked"
    return os.strerror(exc.errno) if exc.errno else type(exc).__name__


def _shown(path: str) -> str:
    """A path as quoted in an error: bounded, one line."""
    text = path.replace("\n", " ").replace("\r", " ")
    return repr(text if len(text) <= 200 else text[:200] + "...")
