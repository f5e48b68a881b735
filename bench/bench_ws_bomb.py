"""Host memory for one compressed WebSocket frame: a 100 KB permessage-deflate "bomb".

Run: ``python bench/bench_ws_bomb.py [--compressed-kb K]``. Prints plain text.

One ``maple-acp serve --http 127.0.0.1:0`` (the checkout's code: run it from the checkout
whose host you measure) is warmed with one WebSocket ``initialize``; its peak resident set
(``VmHWM``) then is the baseline. A second WebSocket offers permessage-deflate in its
handshake and sends, compressed whatever the answer was, one text frame of K KB that inflates
to about 1,000 times that (a JSON message padded with spaces). The figure is the peak RSS
after the host answered (a close frame, or nothing) minus the baseline. Target: at most the
10 MiB message cap; a host that refuses the extension spends about the frame's own size.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_network import WebSocketLines, network_host

MIB = 1024 * 1024
TARGET_MIB = 10.0
#: How long the host gets to answer the frame before the figure is read anyway.
ANSWER_S = 30.0


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found")


def bomb(compressed_bytes: int) -> tuple[bytes, int]:
    """A raw-deflate text payload of about ``compressed_bytes``, and its inflated size."""
    squeezer = zlib.compressobj(level=9, wbits=-15)
    out = [squeezer.compress(b'{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"pad":"')]
    size = sum(map(len, out))
    inflated = 0
    block = b" " * MIB
    while size < compressed_bytes:
        part = squeezer.compress(block)
        out.append(part)
        size += len(part)
        inflated += len(block)
    out.append(squeezer.compress(b'"}}'))
    out.append(squeezer.flush(zlib.Z_SYNC_FLUSH))
    payload = b"".join(out)
    assert payload.endswith(b"\x00\x00\xff\xff")
    return payload[:-4], inflated


def masked_frame(payload: bytes) -> bytes:
    """A final text frame with RSV1 (compressed) set, masked as a client's must be."""
    size = len(payload)
    header = bytes([0x80 | 0x40 | 0x1, 0x80 | 127]) + struct.pack("!Q", size)
    mask = os.urandom(4)
    key = int.from_bytes((mask * (size // 4 + 1))[:size], "big")
    return header + mask + (int.from_bytes(payload, "big") ^ key).to_bytes(size, "big")


def send_bomb(url: str, token: str, payload: bytes) -> tuple[bool, str]:
    """Whether the handshake accepted the extension, and how the host answered the frame."""
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    host, port = netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=ANSWER_S) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /acp HTTP/1.1\r\nHost: {netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {token}\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
        )
        sock.sendall(request.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("the host closed during the handshake")
            answer += data
        head, _, rest = answer.partition(b"\r\n\r\n")
        accepted = b"sec-websocket-extensions" in head.lower()
        sock.sendall(masked_frame(payload))
        received = rest
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
                if len(received) >= 4 and received[0] & 0x0F == 0x8:
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    if len(received) >= 4 and received[0] & 0x0F == 0x8:
        return accepted, f"close {struct.unpack('!H', received[2:4])[0]}"
    return accepted, "closed without a close frame" if not received else "an answer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compressed-kb", type=int, default=100)
    args = parser.parse_args()
    payload, inflated = bomb(args.compressed_kb * 1000)
    with (
        tempfile.TemporaryDirectory(prefix="macp-bench-") as scratch_dir,
        network_host(Path(scratch_dir)) as (host, _socket, url, token),
    ):
        warm = WebSocketLines(url, token)
        warm.write(
            b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'
        )
        warm.flush()
        warm.readline()
        warm.close()
        time.sleep(0.5)
        baseline = peak_rss(host.pid)
        started = time.monotonic()
        accepted, outcome = send_bomb(url, token, payload)
        seconds = time.monotonic() - started
        time.sleep(0.5)
        grown = peak_rss(host.pid) - baseline
    print(f"frame: {len(payload) / 1000:.0f} KB compressed, {inflated / MIB:.0f} MiB inflated")
    print(f"extension accepted in the handshake: {'yes' if accepted else 'no'}")
    print(f"host answered: {outcome} after {seconds:.2f} s")
    print(f"peak RSS growth: {grown / MIB:.1f} MiB (target <= {TARGET_MIB:.0f} MiB)")


if __name__ == "__main__":
    main()
