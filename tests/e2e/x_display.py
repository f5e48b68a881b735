"""A virtual X display for the tests of windows: Xvfb on a free display number, and a
screenshot of it as PNG (``xwd`` takes it; the conversion is here, stdlib only).

Resource handling: ``virtual_display`` ends its Xvfb when the block ends (SIGTERM, then the
process is awaited, shielded: Xvfb ends at once on SIGTERM). Error handling: an Xvfb that
exits before naming its display is an ``AssertionError`` with its stderr; a screenshot in a
pixel format other than 24-bit true colour is a ``ValueError`` (Xvfb is started in that one).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio

#: The virtual screen: room for the example's window, 24-bit colour (what ``xwd_to_png`` reads).
SCREEN = "800x600x24"
#: Values of ``CI`` that mean "this is a CI run" (CI services set ``CI=true``).
CI_VALUES = frozenset({"1", "true", "yes"})
#: Where screenshots go unless ``TEST_ARTIFACTS_DIR`` names a directory (not a ``MAPLE_ACP_*``
#: name: the suite drops those from the environment of every test).
DEFAULT_ARTIFACTS = Path(__file__).resolve().parents[2] / ".test-artifacts"

__all__ = [
    "artifacts_dir",
    "display_tools_missing",
    "png_pixels",
    "screenshot_png",
    "under_ci",
    "virtual_display",
    "without_tools",
    "xwd_to_png",
]


def display_tools_missing(path: str | None = None) -> list[str]:
    """What a window test needs and this machine lacks (each with its Debian package);
    ``path`` is where to look for programs (``PATH`` by default)."""
    missing = []
    if importlib.util.find_spec("_tkinter") is None:
        missing.append("Tk for this Python (python3-tk)")
    if shutil.which("Xvfb", path=path) is None:
        missing.append("Xvfb (xvfb)")
    if shutil.which("xwd", path=path) is None:
        missing.append("xwd (x11-apps)")
    return missing


def under_ci(env: Mapping[str, str]) -> bool:
    """Whether this is a CI run: then a test whose tools are missing fails, never skips."""
    return env.get("CI", "").strip().lower() in CI_VALUES


def without_tools(missing: list[str], *, ci: bool) -> tuple[str, str] | None:
    """What a window test does when tools are missing: ``("skip", reason)`` on a developer's
    machine, ``("fail", reason)`` under CI, where it must run; ``None`` when nothing is."""
    if not missing:
        return None
    reason = "a window test needs " + ", ".join(missing)
    if ci:
        return "fail", f"{reason}; under CI it must run (.ci/run installs them as root)"
    return "skip", reason


def artifacts_dir(env: Mapping[str, str]) -> Path:
    directory = Path(env.get("TEST_ARTIFACTS_DIR") or DEFAULT_ARTIFACTS)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@asynccontextmanager
async def virtual_display() -> AsyncIterator[str]:
    """An Xvfb server on a display number it picks itself (``-displayfd``); yields the value
    for ``DISPLAY``."""
    read_fd, write_fd = os.pipe()
    async with trio.lowlevel.FdStream(read_fd) as numbers:
        try:
            process = await trio.lowlevel.open_process(
                ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", SCREEN, "-nolisten", "tcp"],
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        finally:
            os.close(write_fd)
        try:
            # Xvfb writes the display number once it accepts clients.
            received = b""
            while not received.endswith(b"\n"):
                data = await numbers.receive_some(64)
                if not data:
                    assert process.stderr is not None
                    errors = await process.stderr.receive_some(65536)
                    raise AssertionError(f"Xvfb did not start: {errors.decode(errors='replace')}")
                received += data
            yield f":{int(received)}"
        finally:
            process.terminate()
            with trio.CancelScope(shield=True):
                await process.wait()
            if process.stderr is not None:
                await process.stderr.aclose()


async def screenshot_png(display: str) -> bytes:
    """The whole screen of ``display`` as a PNG image."""
    done = await trio.run_process(
        ["xwd", "-root", "-silent", "-display", display], capture_stdout=True
    )
    return xwd_to_png(done.stdout)


def xwd_to_png(data: bytes) -> bytes:
    """An X window dump (24-bit true colour, 32 bits a pixel, as Xvfb's screen is) as PNG."""
    header = struct.unpack(">25I", data[:100])
    header_size, _version, pixmap_format, depth, width, height = header[:6]
    byte_order, bits_per_pixel, bytes_per_line = header[7], header[11], header[12]
    masks, colours = header[14:17], header[19]
    if (pixmap_format, depth, bits_per_pixel, masks) != (2, 24, 32, (0xFF0000, 0xFF00, 0xFF)):
        raise ValueError(f"not a 24-bit true colour dump: {header[:17]}")
    # Which byte of a pixel holds red, green and blue (least significant first, or not).
    red, green, blue = (2, 1, 0) if byte_order == 0 else (1, 2, 3)
    start = header_size + colours * 12  # the colour map entries follow the header
    rows = []
    for y in range(height):
        pixels = data[start + y * bytes_per_line : start + y * bytes_per_line + width * 4]
        row = bytearray(width * 3)
        row[0::3], row[1::3], row[2::3] = pixels[red::4], pixels[green::4], pixels[blue::4]
        rows.append(b"\0" + row)  # filter type 0: the row as it is

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    image_header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", image_header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def png_pixels(png: bytes) -> tuple[int, int, set[bytes]]:
    """Width, height and the distinct colours of a PNG written by ``xwd_to_png``."""
    width, height = struct.unpack(">II", png[16:24])
    idat_length = struct.unpack(">I", png[33:37])[0]
    raw = zlib.decompress(png[41 : 41 + idat_length])
    stride = 1 + width * 3
    colours = {
        raw[row * stride + 1 + x * 3 : row * stride + 4 + x * 3]
        for row in range(0, height, 4)
        for x in range(0, width, 4)
    }
    return width, height, colours
