"""A command's live output in the runtime: real ``/bin/sh`` children read as they print, at
most one snapshot per 100 ms, a slow consumer coalesced with memory bounded, relay values never
split across snapshots, and background snapshots that coalesce in the session event queue."""

from __future__ import annotations

import itertools
import secrets
import tracemalloc
from pathlib import Path

import trio

from maple_acp.runtime import LIVE_TAIL_CHARS, BackgroundOutput, SessionEvents, ShellOutput
from maple_acp.runtime._live_output import OutputTail
from maple_acp.runtime._relay import RelayRedactor
from maple_acp.runtime._tools import LIVE_OUTPUT_INTERVAL_S, ToolContext

SEQ_LINES = 1_500_000
SEQ_OUTPUT = "".join(f"{n}\n" for n in range(1, SEQ_LINES + 1))
#: The host's memory while a consumer that takes nothing is shown 10 MB of output.
MEMORY_BOUND = 2 * 1024 * 1024
VALUE = secrets.token_hex(16)


async def test_snapshots_come_at_most_every_100_ms_and_add_up_to_the_output(
    tmp_path: Path,
) -> None:
    seen: list[tuple[float, ShellOutput]] = []

    async def sink(output: ShellOutput) -> None:
        seen.append((trio.current_time(), output))

    command = "for i in $(seq 1 30); do echo line $i; sleep 0.01; done"
    result = await ToolContext().run_shell(command, cwd=str(tmp_path), tool_id="t", live=sink)
    expected = "".join(f"line {i}\n" for i in range(1, 31))
    assert result.tail == expected
    *running, (_, last) = seen
    assert running, "nothing was shown while the command ran"
    assert last.exited
    assert last.exit_code == 0
    times = [at for at, _ in running]
    assert all(b - a >= LIVE_OUTPUT_INTERVAL_S for a, b in itertools.pairwise(times))
    # About 300 ms of printing: a few snapshots, never one per line.
    assert len(running) < 15
    assert "".join(output.appended or "" for _, output in seen) == expected
    assert {output.tool_id for _, output in seen} == {"t"}


async def test_a_consumer_that_takes_nothing_gets_one_coalesced_tail(tmp_path: Path) -> None:
    done = tmp_path / "done"
    seen: list[ShellOutput] = []

    async def stalled(output: ShellOutput) -> None:
        seen.append(output)
        if len(seen) == 1:
            # Held until the command printed everything: the pipe is read meanwhile.
            while not done.exists():  # noqa: ASYNC110 - the child says so only on disk
                await trio.sleep(0.01)

    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        result = await ToolContext().run_shell(
            f"seq 1 {SEQ_LINES}; touch {done}", cwd=str(tmp_path), live=stalled
        )
        growth = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    assert growth < MEMORY_BOUND, growth
    assert result.exit_code == 0
    assert result.tail == SEQ_OUTPUT[-LIVE_TAIL_CHARS:]
    assert len(seen) <= 4
    # More came than the tail holds while the consumer waited: it is told to replace.
    assert seen[1].appended is None
    assert seen[-1].exited
    assert seen[-1].tail == SEQ_OUTPUT[-LIVE_TAIL_CHARS:]


def test_a_relay_value_split_across_reads_is_never_shown_in_pieces() -> None:
    tail = OutputTail(RelayRedactor({"TOKEN": VALUE}))
    tail.feed(b"token=" + VALUE[:12].encode())
    shown, appended = tail.take()
    assert shown == "token="
    assert appended == "token="
    tail.feed(VALUE[12:].encode() + b"\n")
    shown, appended = tail.take()
    assert appended == "[relay:TOKEN]\n"
    assert shown == "token=[relay:TOKEN]\n"
    assert VALUE[:8] not in shown


def test_the_tail_is_the_last_characters_exactly_across_split_utf8() -> None:
    tail = OutputTail(RelayRedactor({}))
    text = "é" * (LIVE_TAIL_CHARS + 10)
    data = text.encode()
    for start in range(0, len(data), 7):
        tail.feed(data[start : start + 7])
    shown, appended = tail.take(final=True)
    assert shown == text[-LIVE_TAIL_CHARS:]
    assert appended == text


async def test_background_snapshots_of_one_command_coalesce_in_the_session_queue() -> None:
    events = SessionEvents()

    def snapshot(tool_id: str, appended: str | None) -> BackgroundOutput:
        output = ShellOutput(tool_id=tool_id, command="c", cwd="/", tail="t", appended=appended)
        return BackgroundOutput("task", output)

    for piece in ("a", "b", "c"):
        events.publish(snapshot("one", piece))
    events.publish(snapshot("two", "x"))
    events.publish(snapshot("one", "d"))
    events.close()
    queued = [event async for event in events.take()]
    assert [(e.output.tool_id, e.output.appended) for e in queued] == [  # type: ignore[union-attr]
        ("two", "x"),
        ("one", "abcd"),
    ]
    gapped = SessionEvents()
    gapped.publish(snapshot("one", "a"))
    gapped.publish(snapshot("one", None))
    gapped.publish(snapshot("one", "b"))
    gapped.close()
    (only,) = [event async for event in gapped.take()]
    assert only.output.appended is None  # type: ignore[union-attr]
