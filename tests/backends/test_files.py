"""The native file tools: paths resolve inside the session root (no symlink followed), reads are
bounded, writes and edits report the change as a bounded diff. Real temp dirs and symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maple_acp.model import FileDiff, ToolLocation
from maple_acp.runtime._files import (
    MAX_DIFF_CHARS,
    FileToolError,
    edit_text,
    edit_text_async,
    read_text,
    read_text_async,
    resolve_in_root,
    write_text,
    write_text_async,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('hi')\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    return project


def test_relative_and_absolute_paths_inside_the_root_resolve(root: Path) -> None:
    real = os.path.realpath(root)
    assert resolve_in_root(str(root), "src/main.py") == f"{real}/src/main.py"
    assert resolve_in_root(str(root), f"{root}/src/main.py") == f"{real}/src/main.py"
    assert resolve_in_root(str(root), "new/file.txt") == f"{real}/new/file.txt"
    assert resolve_in_root(str(root), ".") == real


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "src/../../outside.txt", "~"])
def test_paths_escaping_the_root_are_refused(root: Path, path: str) -> None:
    with pytest.raises(FileToolError, match="outside the session's project directory"):
        resolve_in_root(str(root), path)


@pytest.mark.parametrize("path", ["", "   ", "a\x00b"])
def test_blank_or_nul_paths_are_refused(root: Path, path: str) -> None:
    with pytest.raises(FileToolError):
        resolve_in_root(str(root), path)


def test_a_symlink_out_of_the_root_is_refused_for_every_tool(root: Path) -> None:
    (root / "link.txt").symlink_to(root.parent / "outside.txt")
    (root / "linkdir").symlink_to(root.parent)
    for call in (
        lambda: read_text(str(root), "link.txt"),
        lambda: write_text(str(root), "link.txt", "x"),
        lambda: edit_text(str(root), "link.txt", "secret", "x"),
        lambda: write_text(str(root), "linkdir/new.txt", "x"),
    ):
        with pytest.raises(FileToolError, match="outside"):
            call()
    assert (root.parent / "outside.txt").read_text() == "secret\n"
    assert not (root.parent / "new.txt").exists()


def test_a_symlink_inside_the_root_is_refused_too(root: Path) -> None:
    # Even a link that points inside could be repointed between a check and the use.
    (root / "alias.py").symlink_to(root / "src" / "main.py")
    with pytest.raises(FileToolError, match="symlink"):
        read_text(str(root), "alias.py")


def test_a_symlinked_root_is_its_real_path(tmp_path: Path, root: Path) -> None:
    (tmp_path / "rootlink").symlink_to(root)
    assert read_text(str(tmp_path / "rootlink"), "src/main.py").text == "print('hi')\n"


def test_reads_are_bounded_and_marked(root: Path) -> None:
    (root / "big.txt").write_text("a" * 100)
    read = read_text(str(root), "big.txt", max_chars=10)
    assert (read.text, read.truncated) == ("a" * 10, True)
    assert read_text(str(root), "big.txt").truncated is False


def test_reading_a_missing_binary_or_non_regular_file_is_a_clear_error(root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00")
    os.mkfifo(root / "pipe")
    with pytest.raises(FileToolError, match="does not exist"):
        read_text(str(root), "nope.txt")
    with pytest.raises(FileToolError, match="not UTF-8"):
        read_text(str(root), "blob.bin")
    with pytest.raises(FileToolError, match="not a regular file"):
        read_text(str(root), "src")
    # A FIFO must not hang the tool.
    with pytest.raises(FileToolError, match="not a regular file"):
        read_text(str(root), "pipe")


def test_write_creates_a_file_and_its_directories_with_a_new_file_diff(root: Path) -> None:
    change = write_text(str(root), "pkg/sub/mod.py", "x = 1\n")
    target = Path(os.path.realpath(root)) / "pkg" / "sub" / "mod.py"
    assert target.read_text() == "x = 1\n"
    assert change.diff() == FileDiff(path=str(target), new_text="x = 1\n", old_text=None)
    assert change.location() == ToolLocation(path=str(target), line=1)


def test_overwrite_reports_the_old_text_and_first_changed_line(root: Path) -> None:
    (root / "f.txt").write_text("one\ntwo\nthree\n")
    change = write_text(str(root), "f.txt", "one\ntwo\nTHREE\n")
    assert change.old_text == "one\ntwo\nthree\n"
    assert change.line == 3
    assert (root / "f.txt").read_text() == "one\ntwo\nTHREE\n"


def test_edit_replaces_exactly_one_occurrence(root: Path) -> None:
    (root / "f.txt").write_text("alpha\nbeta\ngamma\n")
    change = edit_text(str(root), "f.txt", "beta", "BETA")
    assert (root / "f.txt").read_text() == "alpha\nBETA\ngamma\n"
    assert (change.old_text, change.line) == ("alpha\nbeta\ngamma\n", 2)


def test_edit_refuses_missing_ambiguous_or_empty_matches_and_leaves_the_file(root: Path) -> None:
    (root / "f.txt").write_text("x x\n")
    with pytest.raises(FileToolError, match="not found"):
        edit_text(str(root), "f.txt", "y", "z")
    with pytest.raises(FileToolError, match="occurs 2 times"):
        edit_text(str(root), "f.txt", "x", "z")
    with pytest.raises(FileToolError, match="must not be empty"):
        edit_text(str(root), "f.txt", "", "z")
    with pytest.raises(FileToolError, match="does not exist"):
        edit_text(str(root), "nope.txt", "x", "z")
    assert (root / "f.txt").read_text() == "x x\n"


def test_writing_onto_a_directory_or_fifo_fails_cleanly(root: Path) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(FileToolError, match="not a regular file"):
        write_text(str(root), "src", "x")
    with pytest.raises(FileToolError, match="not a regular file"):
        write_text(str(root), "pipe", "x")


def test_diffs_are_bounded_with_a_visible_flag(root: Path) -> None:
    big = "b" * (MAX_DIFF_CHARS + 10)
    diff = write_text(str(root), "big.txt", big).diff()
    assert diff.truncated
    assert len(diff.new_text) == MAX_DIFF_CHARS
    assert (root / "big.txt").read_text() == big


def test_errors_are_one_bounded_line(root: Path) -> None:
    with pytest.raises(FileToolError) as caught:
        read_text(str(root), "../" + "x\n" * 500)
    text = str(caught.value)
    assert "\n" not in text
    assert len(text) < 300


async def test_async_forms_run_the_same_tools(root: Path) -> None:
    await write_text_async(str(root), "a.txt", "one")
    await edit_text_async(str(root), "a.txt", "one", "two")
    assert (await read_text_async(str(root), "a.txt")).text == "two"


def test_a_dry_run_reports_the_change_without_making_it(root: Path) -> None:
    (root / "f.txt").write_text("a\n")
    planned = write_text(str(root), "f.txt", "b\n", dry_run=True)
    assert (planned.old_text, planned.new_text) == ("a\n", "b\n")
    assert edit_text(str(root), "f.txt", "a", "c", dry_run=True).new_text == "c\n"
    assert write_text(str(root), "new/g.txt", "x", dry_run=True).old_text is None
    assert (root / "f.txt").read_text() == "a\n"
    assert not (root / "new").exists()


def test_absolute_paths_in_any_of_the_session_directories_resolve_from_that_root(
    root: Path, tmp_path: Path
) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    roots = (str(root), str(extra))
    change = write_text(roots, f"{extra}/notes/a.txt", "hello\n")
    assert change.path == f"{os.path.realpath(extra)}/notes/a.txt"
    assert (extra / "notes" / "a.txt").read_text() == "hello\n"
    assert read_text(roots, f"{extra}/notes/a.txt").text == "hello\n"
    # Relative paths stay relative to the project root (the first one).
    assert read_text(roots, "src/main.py").text == "print('hi')\n"
    assert edit_text(roots, f"{extra}/notes/a.txt", "hello", "bye").new_text == "bye\n"
    # `..` below an additional directory cannot climb out of it, and other places are refused.
    for path in (f"{extra}/../outside.txt", "/etc/passwd", "../extra/notes/a.txt"):
        with pytest.raises(FileToolError, match="outside the session's directories"):
            read_text(roots, path)


def test_a_symlink_inside_an_additional_directory_is_refused(root: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "link").symlink_to(root.parent)
    with pytest.raises(FileToolError, match="symlink"):
        write_text((str(root), str(extra)), f"{extra}/link/outside.txt", "x")
    assert (tmp_path / "outside.txt").read_text() == "secret\n"
