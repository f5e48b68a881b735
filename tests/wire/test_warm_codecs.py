"""After ``wire.warm_codecs()`` a host's first requests generate no converter code: the
structure and unstructure functions of every wire type were built in advance (a fresh process
each time, so that the converter starts cold)."""

from __future__ import annotations

import subprocess
import sys

#: Counts the functions the converter generates (it registers their source with linecache)
#: while a prompt is read and its first answers are written.
SCRIPT = """
import linecache, sys
from maple_acp import wire
def generated():
    return sum(1 for key in linecache.cache if key.startswith("<cattrs"))
if sys.argv[1] == "warm":
    for _ in wire.warm_codecs():
        pass
before = generated()
wire.structure_params(
    {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}, wire.PromptRequest
)
chunk = wire.AgentMessageChunk(content=wire.TextContent(text="x"), message_id="m")
wire.encode(wire.SessionNotification(session_id="s", update=chunk))
wire.encode(wire.PromptResponse(stop_reason="end_turn"))
wire.encode(wire.v2.V2PromptResponse(message_id="m"))
print(generated() - before)
"""


def _generated_during_first_requests(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_a_warmed_converter_generates_nothing_on_first_use() -> None:
    assert _generated_during_first_requests("cold") > 0
    assert _generated_during_first_requests("warm") == 0
