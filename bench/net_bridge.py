"""A stdio client of ``serve --http`` for the soak: it stands where a connector stands (lines on
stdin and stdout) but reaches the host over its network listener.

    python bench/net_bridge.py ws|http URL TOKEN_FILE [--socket IGNORED]

``ws``: one WebSocket; each stdin line is one text message (bytes that are not UTF-8 are
replaced, as a client's encoder would), each message one stdout line. ``http``: Streamable
HTTP as the official TypeScript client does it: ``initialize`` POSTed and answered in its
body, the connection stream opened, and a session's stream opened before the first message
that names the session (sent with ``Acp-Session-Id``); every event's data is one stdout line.
End of stdin closes the WebSocket, or DELETEs the HTTP connection and waits for its stream to
end. A killed bridge is a client gone without a word, as a killed connector is.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

STDOUT_LOCK = threading.Lock()


def emit(line: bytes) -> None:
    with STDOUT_LOCK:
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()


def websocket(url: str, token: str) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(
        url.replace("http", "ws", 1),
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=None,
    ) as ws:

        def forward() -> None:
            try:
                for line in sys.stdin.buffer:
                    ws.send(line.rstrip(b"\n").decode("utf-8", "replace"))
            except ConnectionClosed:
                pass
            ws.close()

        threading.Thread(target=forward, daemon=True).start()
        try:
            while True:
                message = ws.recv()
                emit(message.encode() if isinstance(message, str) else message)
        except ConnectionClosed:
            return


def streamable_http(url: str, token: str) -> None:
    import httpx

    auth = {"Authorization": f"Bearer {token}"}
    client = httpx.Client(timeout=httpx.Timeout(30.0, read=None), trust_env=False)
    connection: dict[str, str] = {}
    streams: dict[str | None, threading.Thread] = {}
    opened: dict[str | None, threading.Event] = {}

    def read_stream(session_id: str | None) -> None:
        headers = {**auth, **connection, "Accept": "text/event-stream"}
        if session_id is not None:
            headers["Acp-Session-Id"] = session_id
        try:
            with client.stream("GET", url, headers=headers) as response:
                opened[session_id].set()
                if response.status_code != 200:
                    return
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        emit(line[6:].encode())
        except httpx.HTTPError:
            pass
        finally:
            opened[session_id].set()

    def open_stream(session_id: str | None) -> None:
        if session_id in streams and streams[session_id].is_alive():
            return
        opened[session_id] = threading.Event()
        thread = threading.Thread(target=read_stream, args=(session_id,), daemon=True)
        streams[session_id] = thread
        thread.start()
        opened[session_id].wait(30)

    for raw in sys.stdin.buffer:
        line = raw.rstrip(b"\n")
        try:
            message: Any = json.loads(line)
        except ValueError:
            message = None
        headers = {**auth, **connection, "Content-Type": "application/json"}
        if not connection:
            answer = client.post(url, content=line, headers=headers)
            if answer.status_code != 200:
                return
            connection["Acp-Connection-Id"] = answer.headers["acp-connection-id"]
            emit(answer.content)
            open_stream(None)
            continue
        params = message.get("params") if isinstance(message, dict) else None
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        if isinstance(session_id, str) and session_id.strip():
            open_stream(session_id)
            headers["Acp-Session-Id"] = session_id
        answer = client.post(url, content=line, headers=headers)
        if answer.status_code in (401, 403, 404, 410):
            return
    if connection:
        client.delete(url, headers={**auth, **connection})
        main = streams.get(None)
        if main is not None:
            main.join(30)


def main(argv: list[str]) -> None:
    kind, url, token_file = argv[:3]
    token = Path(token_file).read_text().strip()
    if kind == "ws":
        websocket(url, token)
    else:
        streamable_http(url, token)


if __name__ == "__main__":
    main(sys.argv[1:])
