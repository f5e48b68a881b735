"""Steering racing cancel, close and the end of a turn: Hypothesis draws sequences of operations
on one lease (prompts, steering messages, backend steps, the end of a backend turn, cancel,
close) and runs each on a fresh service over a real SQLite file.

Nothing is lost: every admitted (``INJECTED``) message is in the history exactly once and either
reached a backend (``turn.steering()`` or a follow-up turn's prompt) or its run was cancelled,
and then the next turn of the lease has it in its history. A message the runtime did not admit
(``IDLE``, a refusal) is not in the history unless a turn was started with it. Nothing hangs:
every example ends within its deadline, close included.

``HYPOTHESIS_PROFILE=long`` runs many more examples.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from maple_acp.model import ItemKind
from maple_acp.runtime import (
    Run,
    RunState,
    RuntimeRejection,
    SessionLease,
    SteeringOutcome,
    Turn,
    TurnResult,
)
from maple_acp.testing.demo import demo_service
from maple_acp.testing.store import open_temp_store

#: Real time an example may take (a hang fails the example instead of the suite).
EXAMPLE_DEADLINE_S = 10.0
#: A pause long enough for the store's worker thread to answer between two operations.
SETTLE_S = 0.002

OPERATIONS = st.sampled_from(
    ["prompt", "steer", "steer_or_start", "step", "finish", "cancel", "settle"]
)


@attrs.define
class TurnSeen:
    prompt: str
    history: list[str]
    taken: list[str] = attrs.Factory(list)


class Gate:
    """A backend driven by the test: each turn waits for tokens; ``step`` takes the steering
    that arrived (when ``reads``), ``finish`` ends the turn."""

    def __init__(self, reads: bool) -> None:
        self.reads = reads
        self.send, self.receive = trio.open_memory_channel[str](1000)
        self.turns: list[TurnSeen] = []
        self.turns_by_run: dict[str, list[TurnSeen]] = {}

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        seen = TurnSeen(turn.prompt, [item.text for item in turn.history])
        self.turns.append(seen)
        self.turns_by_run.setdefault(turn.run_id, []).append(seen)
        async for token in self.receive:
            if token == "step" and self.reads:
                seen.taken.extend(item.text for item in turn.steering())
            elif token == "finish":
                break
        return None


async def run_example(ops: list[str], reads: bool, directory: Path) -> None:
    backend = Gate(reads)
    project = directory / "project"
    project.mkdir()
    data = directory / "data"
    data.mkdir()
    outcomes: dict[str, SteeringOutcome | str] = {}
    started_with: set[str] = set()
    #: Texts a start was tried with: admitted at most once, even if the close won the race.
    attempted: set[str] = set()
    runs: list[Run] = []
    with trio.fail_after(EXAMPLE_DEADLINE_S):
        async with demo_service(data, backend=backend) as service, trio.open_nursery() as tasks:
            lease: SessionLease = await tasks.start(service.serve_new_task, str(project))

            async def prompt(text: str) -> None:
                attempted.add(text)
                try:
                    runs.append(await lease.start_run(text))
                    started_with.add(text)
                except RuntimeRejection:
                    pass

            async def steer(text: str, start: bool) -> None:
                try:
                    outcome = await lease.steer(text)
                except RuntimeRejection as exc:
                    outcomes[text] = exc.kind.value
                    return
                outcomes[text] = outcome
                if outcome is SteeringOutcome.IDLE and start:
                    await prompt(text)

            for serial, op in enumerate(ops):
                text = f"{op}-{serial}"
                if op == "prompt":
                    tasks.start_soon(prompt, text)
                elif op in ("steer", "steer_or_start"):
                    tasks.start_soon(steer, text, op == "steer_or_start")
                elif op in ("step", "finish"):
                    backend.send.send_nowait(op)
                elif op == "cancel":
                    lease.cancel_run()
                await trio.sleep(SETTLE_S)

            # The end: close the lease while whatever is left runs, as a client's close would.
            await lease.release(close=True)
            backend.send.close()
        store_items = await _history(data, lease.task_id)
    states = {run.id: run.outcome.state for run in runs if run.outcome is not None}
    assert len(states) == len(runs), "a run did not end"
    check(store_items, outcomes, started_with, attempted, backend.turns, states)


def check(
    store_items: list[tuple[ItemKind, str, str]],
    outcomes: dict[str, SteeringOutcome | str],
    started_with: set[str],
    attempted: set[str],
    turns: list[TurnSeen],
    states: dict[str, RunState],
) -> None:
    users = [text for kind, text, _ in store_items if kind is ItemKind.USER]
    run_of = {text: run_id for kind, text, run_id in store_items if kind is ItemKind.USER}
    counts = Counter(users)
    for text in attempted:
        # A start the close overtook may have admitted its message or not; never twice.
        expected = {1} if text in started_with else {0, 1}
        assert counts[text] in expected, (text, store_items)
    for text, outcome in outcomes.items():
        if outcome is not SteeringOutcome.INJECTED:
            if text not in attempted:
                assert counts[text] == 0, (text, outcome, store_items)
            continue
        assert counts[text] == 1, (text, store_items)
        delivered = sum(text in seen.taken or text in seen.prompt.split("\n\n") for seen in turns)
        assert delivered <= 1, (text, turns)
        if delivered:
            continue
        # Not taken: only a cancelled run leaves one behind (a completed one made it a
        # follow-up turn's message) ...
        assert states[run_of[text]] is RunState.CANCELLED, (text, states, turns)
        # ... and every turn that began after it was admitted has it in its history.
        at = users.index(text)
        for seen in turns:
            first = seen.prompt.split("\n\n")[0]
            if first in counts and users.index(first) > at:
                assert text in seen.history, (text, seen, store_items)


async def _history(data: Path, task_id: str) -> list[tuple[ItemKind, str, str]]:
    store = await open_temp_store(data)
    try:
        return [(item.kind, item.text, item.run_id or "") for item in await store.history(task_id)]
    finally:
        await store.aclose()


@settings(
    max_examples=400 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 25,
    deadline=None,
)
@given(ops=st.lists(OPERATIONS, min_size=1, max_size=14), reads=st.booleans())
def test_steering_races_lose_nothing_and_never_hang(ops: list[str], reads: bool) -> None:
    with tempfile.TemporaryDirectory() as directory:
        trio.run(run_example, ops, reads, Path(directory))
