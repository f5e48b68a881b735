"""Native file tools a backend may offer its model: paths resolved inside the session's
directories, bounded reads, and writes and edits that report what changed as a ``FileDiff``.

Each function takes the session's roots (``turn.roots``: the project root first, then its
additional directories; a single root may be passed as a string). A relative path is taken
relative to the first root; an absolute one belongs to the root whose path is its longest
prefix, and is refused when none is. ``..`` is taken lexically and may not climb above that
root, and no symlink below the root is followed: every component
is opened from a directory fd of the root (``_beneath``), so a directory swapped for a symlink
while a tool works cannot move a read, a write or an edit outside. Refusals are a
``FileToolError`` whose text is safe to show the model and the caller. This is the host's
policy for its own tools, not a sandbox.

Resource handling: each call opens the root, at most the file's parent directory and the file,
and closes them all before it returns or raises. A write truncates and rewrites the file in
place through an fd opened relative to its parent's fd (no temporary file, no rename); missing
parent directories are made one ``mkdir`` at a time relative to the previous one.

Error handling: every ``OSError`` becomes a one-line ``FileToolError`` naming the path as given
(bounded); a symlink anywhere in the path is refused as such.

Cancellation: the functions are synchronous (plain file I/O); a backend calls the ``*_async``
forms, which run them on a worker thread that is not abandoned on cancellation (a write either
happens or not before the caller sees the cancellation).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

import attrs

from maple_acp._exceptions import MapleAcpError
from maple_acp.model import FileDiff, ToolLocation
from maple_acp.runtime import _beneath
from maple_acp.runtime._threads import in_worker_thread

#: The session's directories (project root first), or the one root as a string.
Roots = str | Sequence[str]

#: A file read returns at most this much text; a model asking for more gets a marked cut.
MAX_READ_CHARS = 256 * 1024
#: A file larger than this is not read at all (its first bytes would be a poor answer).
MAX_FILE_BYTES = 8 * 1024 * 1024
#: Text a write or edit may produce: a tool call is not the way to write huge files.
MAX_WRITE_CHARS = 4 * 1024 * 1024
#: Each side of a diff kept for the caller's view; the file itself keeps all of it.
MAX_DIFF_CHARS = 64 * 1024

# O_NONBLOCK: opening a FIFO someone put in the tree must not hang the tool.
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK


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


def resolve_in_root(root: Roots, path: str) -> str:
    """The absolute path ``path`` names inside ``root`` (below the root's real path).

    ``path`` is relative to ``root`` or absolute (under ``root`` as given or under its real
    path); ``..`` is taken lexically and may not climb above ``root``. A path the file tools
    would refuse because a symlink is in it is refused here too (the part that does not exist
    yet is not looked at). A caller that then opens the path string itself gets none of the
    tools' protection against a swap meanwhile. Raises ``FileToolError``."""
    target = _Target.of(root, path)
    if target.names:
        root_fd = target.open_root()
        try:
            _refuse_a_symlink(root_fd, target)
        finally:
            os.close(root_fd)
    return target.resolved


def read_text(root: Roots, path: str, *, max_chars: int = MAX_READ_CHARS) -> FileRead:
    """Read a UTF-8 text file inside ``root``, at most ``max_chars`` characters of it."""
    target = _Target.of(root, path)
    root_fd = target.open_root()
    try:
        text = _read_existing(root_fd, target.names, target.shown)
    finally:
        os.close(root_fd)
    if text is None:
        raise FileToolError(f"{target.shown} does not exist")
    limit = max(0, min(max_chars, MAX_READ_CHARS))
    return FileRead(path=target.resolved, text=text[:limit], truncated=len(text) > limit)


def write_text(root: Roots, path: str, content: str, *, dry_run: bool = False) -> FileChange:
    """Create or replace a text file inside ``root`` (creating missing parent directories
    inside it too). ``dry_run`` checks everything and returns the change without making it,
    so a caller can show the diff before asking."""
    if not isinstance(content, str):
        raise FileToolError("the file content must be text")
    if len(content) > MAX_WRITE_CHARS:
        raise FileToolError(f"a file written by a tool is limited to {MAX_WRITE_CHARS} characters")
    target = _Target.of(root, path)
    root_fd = target.open_root()
    try:
        # The old text is read and the new one written through one fd of the parent, so the
        # diff shown is of the file written even if a directory is renamed meanwhile.
        parent_fd = _open_parent(root_fd, target, create=False)
        if parent_fd is None and not dry_run:
            parent_fd = _open_parent(root_fd, target, create=True)
    finally:
        os.close(root_fd)
    try:
        old = None if parent_fd is None else _read_existing(parent_fd, target.last, target.shown)
        change = FileChange(
            path=target.resolved,
            old_text=old,
            new_text=content,
            line=_first_changed_line(old, content),
        )
        if not dry_run:
            assert parent_fd is not None
            _write(parent_fd, target, content)
    finally:
        if parent_fd is not None:
            os.close(parent_fd)
    return change


def edit_text(
    root: Roots, path: str, old_text: str, new_text: str, *, dry_run: bool = False
) -> FileChange:
    """Replace the one occurrence of ``old_text`` in an existing text file inside ``root``
    (``dry_run``: as for ``write_text``)."""
    if not isinstance(old_text, str) or not isinstance(new_text, str):
        raise FileToolError("old_text and new_text must be text")
    if not old_text:
        raise FileToolError("old_text must not be empty")
    target = _Target.of(root, path)
    root_fd = target.open_root()
    try:
        parent_fd = _open_parent(root_fd, target, create=False)
    finally:
        os.close(root_fd)
    if parent_fd is None:
        raise FileToolError(f"{target.shown} does not exist")
    try:
        current = _read_existing(parent_fd, target.last, target.shown)
        if current is None:
            raise FileToolError(f"{target.shown} does not exist")
        count = current.count(old_text)
        if count == 0:
            raise FileToolError(f"old_text was not found in {target.shown}")
        if count > 1:
            raise FileToolError(
                f"old_text occurs {count} times in {target.shown}; include more context to pick one"
            )
        at = current.index(old_text)
        updated = current[:at] + new_text + current[at + len(old_text) :]
        if len(updated) > MAX_WRITE_CHARS:
            raise FileToolError(
                f"a file written by a tool is limited to {MAX_WRITE_CHARS} characters"
            )
        if not dry_run:
            _write(parent_fd, target, updated)
    finally:
        os.close(parent_fd)
    return FileChange(
        path=target.resolved,
        old_text=current,
        new_text=updated,
        line=current.count("\n", 0, at) + 1,
    )


async def read_text_async(root: Roots, path: str, *, max_chars: int = MAX_READ_CHARS) -> FileRead:
    return await in_worker_thread(lambda: read_text(root, path, max_chars=max_chars))


async def write_text_async(
    root: Roots, path: str, content: str, *, dry_run: bool = False
) -> FileChange:
    return await in_worker_thread(lambda: write_text(root, path, content, dry_run=dry_run))


async def edit_text_async(
    root: Roots, path: str, old_text: str, new_text: str, *, dry_run: bool = False
) -> FileChange:
    return await in_worker_thread(
        lambda: edit_text(root, path, old_text, new_text, dry_run=dry_run)
    )


@attrs.frozen
class _Target:
    """A tool's path split into names below the root's real path, checked lexically."""

    real_root: str
    #: Components below the root: never empty strings, ``.`` or ``..``.
    names: tuple[str, ...]
    #: The path as quoted in errors.
    shown: str

    @classmethod
    def of(cls, root: Roots, path: str) -> _Target:
        roots = (root,) if isinstance(root, str) else tuple(root)
        if not roots:
            raise FileToolError("the session has no directory")
        if not isinstance(path, str) or not path.strip():
            raise FileToolError("a file path is required")
        if "\x00" in path:
            raise FileToolError("a file path cannot contain NUL")
        outside = f"{_shown(path)} is outside the session's " + (
            "project directory" if len(roots) == 1 else "directories"
        )
        wanted = os.path.expanduser(path) if path.startswith("~") else path
        if os.path.isabs(wanted):
            wanted = os.path.normpath(wanted)
            # The root whose path (real, or as given) is the longest prefix: a directory nested
            # in another is its own root, so `..` below it cannot climb into the outer one.
            matches = [
                (len(base), os.path.realpath(each), base)
                for each in roots
                for base in (os.path.realpath(each), os.path.abspath(each))
                if _inside(base, wanted)
            ]
            if not matches:
                raise FileToolError(outside)
            _, real_root, base = max(matches, key=lambda match: match[0])
            wanted = wanted[len(base) :]
        else:
            real_root = os.path.realpath(roots[0])
        names: list[str] = []
        for name in wanted.split(os.sep):
            if name == "..":
                if not names:
                    raise FileToolError(outside)
                # Lexical: no symlink is followed below the root, so this is what the kernel
                # would do too, and no `..` ever reaches it.
                names.pop()
            elif name not in ("", "."):
                names.append(name)
        return cls(real_root, tuple(names), _shown(path))

    @property
    def resolved(self) -> str:
        return os.path.join(self.real_root, *self.names)

    @property
    def last(self) -> tuple[str, ...]:
        """The file's own name (none for the root itself)."""
        return self.names[-1:]

    def open_root(self) -> int:
        try:
            return os.open(self.real_root, _beneath.DIRECTORY_FLAGS)
        except OSError as exc:
            raise FileToolError(
                f"cannot open the session's project directory: {_reason(exc)}"
            ) from None


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _open_parent(root_fd: int, target: _Target, *, create: bool) -> int | None:
    """An fd of the directory holding ``target`` (``None`` when it does not exist)."""
    try:
        return _beneath.open_directory_beneath(root_fd, target.names[:-1], create=create)
    except FileNotFoundError:
        if create:
            raise FileToolError(
                f"cannot create the directory of {target.shown}: {os.strerror(errno.ENOENT)}"
            ) from None
        return None
    except OSError as exc:
        doing = "create the directory of" if create else "open"
        raise _refusal(exc, target.shown, doing) from None


def _refuse_a_symlink(root_fd: int, target: _Target) -> None:
    """Refuse ``target`` if a symlink is in it, as far as it exists."""
    try:
        parent_fd = _beneath.open_directory_beneath(root_fd, target.names[:-1])
        try:
            mode = os.stat(target.names[-1], dir_fd=parent_fd, follow_symlinks=False).st_mode
        finally:
            os.close(parent_fd)
    except (FileNotFoundError, NotADirectoryError):
        return  # it does not exist (yet): nothing to follow
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise _refusal(exc, target.shown, "open") from None
        return  # not ours to judge here: the tool that opens it reports it
    if stat.S_ISLNK(mode):
        raise _symlink_refusal(target.shown)


def _read_existing(dir_fd: int, names: tuple[str, ...], shown: str) -> str | None:
    """The text of the file ``names`` name below ``dir_fd``, ``None`` when it does not exist."""
    try:
        fd = _beneath.open_beneath(dir_fd, names, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refusal(exc, shown, "open") from None
    _require_regular(fd, shown)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise FileToolError(f"{shown} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileToolError(f"{shown} is not UTF-8 text") from None


def _write(parent_fd: int, target: _Target, content: str) -> None:
    """Write ``content`` into the file named ``target.last`` in ``parent_fd``, in place."""
    try:
        fd = _beneath.open_beneath(parent_fd, target.last, _WRITE_FLAGS, 0o666)
    except OSError as exc:
        raise _refusal(exc, target.shown, "write") from None
    _require_regular(fd, target.shown)
    with os.fdopen(fd, "wb") as handle:
        # Truncated only now that it is known to be a regular file.
        handle.truncate(0)
        handle.write(content.encode("utf-8"))


def _require_regular(fd: int, shown: str) -> None:
    """Close ``fd`` and refuse unless it is a regular file (not a directory, FIFO or device)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileToolError(f"{shown} is not a regular file")


def _first_changed_line(old: str | None, new: str) -> int:
    if old is None:
        return 1
    common = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        common += 1
    return new.count("\n", 0, common) + 1


def _refusal(exc: OSError, shown: str, doing: str) -> FileToolError:
    if exc.errno == errno.ELOOP:
        return _symlink_refusal(shown)
    if exc.errno == errno.EXDEV:
        return FileToolError(f"{shown} is outside the session's project directory")
    return FileToolError(f"cannot {doing} {shown}: {_reason(exc)}")


def _symlink_refusal(shown: str) -> FileToolError:
    return FileToolError(
        f"{shown} is or goes through a symlink, which file tools do not follow:"
        " it could lead outside the session's project directory"
    )


def _reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else type(exc).__name__


def _shown(path: str) -> str:
    """A path as quoted in an error: bounded, one line."""
    text = path.replace("\n", " ").replace("\r", " ")
    return repr(text if len(text) <= 200 else text[:200] + "...")
