"""A Hypothesis-driven scenario machine over 2-3 ACP connections to one service.

Each example is a list of operations (new, load and resume - a re-attach when the connection
holds the session -, delete, prompt with every kind of permission answer, cancel, close, a close
and a load or resume written back to back, a cancel and a prompt written back to back, set the
model, disconnect, list, advance virtual time, account change, runtime stop; a prompt may
delegate to a child session that waits to be cancelled, and a connection that declared
``subagents`` may cancel that child alone by its id) run inside one
``trio.run`` on a mock clock; ``edge_machine`` holds the engine and the invariants it checks
after every settled step.
"""

from __future__ import annotations

from edge_machine import (
    CANCEL_BEFORE_RUN,
    CHAT_MODELS,
    CLOSE_S,
    GRACE_S,
    SWEEP_S,
    Advance,
    AnswerLate,
    Cancel,
    CancelChild,
    CancelThenPrompt,
    Close,
    CloseThenOpen,
    Delete,
    Disconnect,
    Initialize,
    List,
    Load,
    New,
    Op,
    Prompt,
    QueueClear,
    Resume,
    SetModel,
    StopRuntime,
    SwitchAccount,
    run_scenario,
)
from hypothesis import given, settings
from hypothesis import strategies as st

#: The default suite runs at least this many examples; the "long" profile runs more.
MIN_EXAMPLES = 100
#: What the generated scenarios cannot decide from the client's side (see CANCEL_BEFORE_RUN).
KNOWN_FINDINGS = frozenset({CANCEL_BEFORE_RUN})

#: Three connections, the first busiest, so most operations meet sessions they can act on.
conns = st.sampled_from([0, 0, 0, 1, 1, 2])
#: Small indices act on the connection's own sessions, larger ones on any known task.
tasks = st.integers(0, 5)
#: Mostly settle after an operation; sometimes let the next one race it.
thens = st.sampled_from([None, None, None, None, None, 0, 1, 3])
scripts = st.sampled_from(["echo", "hang", "tool", "tool", "delegate"])
answers = st.sampled_from(["allow", "reject", "cancel", "malformed", "deferred"])

#: Each kind of operation, with how often it is drawn (out of the sum of the weights).
KINDS: dict[str, tuple[int, st.SearchStrategy[Op]]] = {
    "new": (6, st.builds(New, conns, thens)),
    "prompt": (9, st.builds(Prompt, conns, tasks, scripts, answers, thens)),
    "cancel": (3, st.builds(Cancel, conns, tasks, thens)),
    "cancel_child": (2, st.builds(CancelChild, conns, tasks, thens)),
    "close": (3, st.builds(Close, conns, tasks, thens)),
    "load": (4, st.builds(Load, conns, tasks, thens)),
    "close_then_open": (
        2,
        st.builds(
            CloseThenOpen, conns, tasks, st.sampled_from(["session/load", "session/resume"]), thens
        ),
    ),
    "cancel_then_prompt": (
        2,
        st.builds(CancelThenPrompt, conns, tasks, st.sampled_from(["echo", "hang", "tool"]), thens),
    ),
    "resume": (2, st.builds(Resume, conns, tasks, thens)),
    "delete": (2, st.builds(Delete, conns, tasks, thens)),
    "answer_late": (2, st.builds(AnswerLate, conns, thens)),
    "disconnect": (2, st.builds(Disconnect, conns, thens)),
    "set_model": (
        2,
        st.builds(SetModel, conns, tasks, st.sampled_from([*CHAT_MODELS, "demo-embed"]), thens),
    ),
    "list": (1, st.builds(List, conns, thens)),
    "queue_clear": (2, st.builds(QueueClear, conns, tasks, thens)),
    "initialize": (1, st.builds(Initialize, conns, st.booleans(), thens)),
    "advance": (
        2,
        st.builds(Advance, st.sampled_from([1.0, CLOSE_S, GRACE_S / 2, GRACE_S + SWEEP_S + 1])),
    ),
    "switch_account": (1, st.builds(SwitchAccount, st.sampled_from(["lifecycle", "bare"]))),
    "stop_runtime": (1, st.builds(StopRuntime, st.sampled_from(["lifecycle", "drain"]))),
}
operations: st.SearchStrategy[Op] = st.sampled_from(
    [kind for kind, (weight, _) in KINDS.items() for _ in range(weight)]
).flatmap(lambda kind: KINDS[kind][1])
#: Every scenario starts with a session on the first connection, so that most operations
#: meet something they can act on; half the time that connection first declared
#: ``subagents``, so its session's children are announced and can be cancelled alone.
scenarios = st.tuples(st.booleans(), st.lists(operations, max_size=14)).map(
    lambda drawn: [*([Initialize(0, subagents=True)] if drawn[0] else []), New(0), *drawn[1]]
)


@settings(max_examples=max(MIN_EXAMPLES, settings().max_examples), deadline=None)
@given(scenarios)
def test_edge_scenarios(ops: list[Op]) -> None:
    run_scenario(ops, tolerate=KNOWN_FINDINGS)


def test_waiting_prompts_are_withdrawn_by_a_cancel_and_a_clear() -> None:
    # Prompts sent while a turn runs wait in the queue: a cancel ends the turn and withdraws
    # them (their tools never run), a clear withdraws them and leaves the turn running.
    run_scenario(
        [
            New(0),
            Prompt(0, 0, "hang"),
            Prompt(0, 0, "echo"),
            Prompt(0, 0, "tool", "allow"),
            Cancel(0, 0),
            Prompt(0, 0, "hang"),
            Prompt(0, 0, "tool", "allow"),
            Prompt(0, 0, "echo"),
            QueueClear(0, 0),
            Prompt(0, 0, "echo"),
            Cancel(0, 0),
            Prompt(0, 0, "echo"),
        ]
    )


def test_the_last_cancel_withdraws_the_prompts_waiting_behind_a_turn() -> None:
    # The cancel that ends a scenario answers a prompt waiting behind the running turn
    # cancelled (its turn never runs), and the model must expect that.
    run_scenario([New(0), Prompt(0, 0, "hang"), Prompt(0, 0, "echo")])


def test_a_plain_life() -> None:
    run_scenario(
        [
            Initialize(0),
            New(0),
            Prompt(0, 0, "echo"),
            Prompt(0, 0, "tool", "allow"),
            New(1),
            Disconnect(1),
            Load(2, 1),
            Close(2, 1),
            List(0),
        ]
    )


def test_every_permission_answer_but_allow_keeps_the_tool_from_running() -> None:
    run_scenario(
        [
            New(0),
            Prompt(0, 0, "tool", "reject"),
            Prompt(0, 0, "tool", "cancel"),
            Prompt(0, 0, "tool", "malformed"),
            Prompt(0, 0, "tool", "malformed"),
            Prompt(0, 0, "tool", "deferred"),
            Cancel(0, 0),
            AnswerLate(0),
            Prompt(0, 0, "tool", "deferred"),
            Close(0, 0),
            New(1),
            Prompt(1, 0, "tool", "deferred"),
            Disconnect(1),
        ]
    )


def test_a_provisional_task_outlives_a_disconnect_only_for_its_grace_period() -> None:
    run_scenario(
        [
            New(0),
            SetModel(0, 0, "demo-echo-large"),
            Disconnect(0),
            List(1),
            Advance(GRACE_S / 2),
            Load(1, 0),
            Disconnect(1),
            Advance(GRACE_S + SWEEP_S + 1),
            Load(2, 0),
        ]
    )


def test_a_close_deletes_an_untouched_task_whoever_holds_it() -> None:
    # Created on one connection, loaded and closed on another (acpx splits new and prompt).
    run_scenario(
        [
            New(0),
            SetModel(0, 0, "demo-echo-large"),
            Close(0, 0),
            Load(1, 0),
            New(0),
            Disconnect(0),
            Load(1, 1),
            Close(1, 0),
            Load(2, 1),
        ]
    )


def test_the_model_locks_with_the_first_prompt() -> None:
    run_scenario(
        [
            New(0),
            SetModel(0, 0, "demo-echo-large"),
            Prompt(0, 0, "echo"),
            SetModel(0, 0, "demo-echo"),
            SetModel(0, 0, "demo-echo-large"),
            Close(0, 0),
            Load(1, 0),
            SetModel(1, 0, "demo-echo"),
        ]
    )


def test_account_changes_and_runtime_stop_end_sessions() -> None:
    run_scenario(
        [
            New(0),
            Prompt(0, 0, "hang"),
            New(1),
            Prompt(1, 0, "tool", "deferred"),
            SwitchAccount("bare"),
            New(0),
            Prompt(0, 0, "hang"),
            SwitchAccount("lifecycle"),
            Load(1, 0),
            List(2),
            StopRuntime("drain"),
            New(2),
        ]
    )


def test_reattach_resume_and_delete() -> None:
    run_scenario(
        [
            New(0),
            Prompt(0, 0, "echo"),
            Load(0, 0),
            Resume(0, 0),
            Prompt(0, 0, "hang"),
            Load(0, 0),
            Resume(0, 0),
            Delete(0, 0),
            Delete(1, 3),
            Cancel(0, 0),
            Load(1, 3),
            Delete(0, 0),
            Load(1, 3),
            Resume(2, 3),
            List(1),
            New(1),
            Delete(1, 0),
            Resume(1, 4),
        ]
    )


def test_a_reload_raced_by_a_close_ends_closed() -> None:
    # Found by the long profile: the re-attach answers first, then the close ends the session.
    run_scenario([New(0), Load(conn=0, task=0, then=3), Close(conn=0, task=0)])
    run_scenario([New(0), Prompt(0, 0, "echo"), Close(0, 0), Load(1, 0, then=3), Close(1, 0)])


def test_a_delete_refused_by_a_draining_runtime_still_closed_the_session() -> None:
    # Found by the long profile: the edge closes its own session before asking the runtime.
    run_scenario([New(0), StopRuntime("drain"), Delete(0, 0)])
    run_scenario([New(0), Prompt(0, 0, "echo"), StopRuntime("drain"), Delete(0, 0)])


def test_deletes_in_flight_when_the_host_stops() -> None:
    # Found by the long profile: a delete whose connection ends first may or may not happen.
    run_scenario(
        [
            New(0),
            Prompt(0, 4, "echo"),
            New(0),
            New(2),
            Load(2, 3),
            Prompt(0, 0, "tool", "cancel"),
            Prompt(0, 5, "tool", "cancel", then=3),
            Delete(0, 0, then=3),
            AnswerLate(0, then=3),
            Delete(2, 3, then=0),
            Delete(0, 1, then=1),
            StopRuntime("lifecycle"),
            New(1, then=1),
            Resume(1, 5, then=3),
            New(0),
        ]
    )


def test_a_prompt_sent_while_another_ran_may_run_after_it() -> None:
    # Found by the long profile: the second prompt is admitted once the first ends, so a
    # re-attach after that meets a running prompt.
    run_scenario(
        [
            New(0),
            SwitchAccount("lifecycle"),
            New(0),
            Prompt(0, 0, "echo"),
            Prompt(0, 0, "echo", then=0),
            Prompt(0, 0, "hang"),
            Load(0, 0),
        ]
    )


def test_deletes_raced_by_prompts_news_and_account_changes() -> None:
    # Found by the long profile.
    base: list[Op] = [New(0), Prompt(0, 0, "echo"), Delete(0, 0, then=3), New(0, then=1)]
    run_scenario([*base, Delete(1, 0)])
    run_scenario([*base, Delete(0, 0)])
    run_scenario(
        [
            *base,
            Prompt(0, 0, "echo", then=3),
            SwitchAccount("bare"),
            Prompt(1, 1, "hang", "deferred"),
            Close(0, 3),
        ]
    )


def test_a_load_or_resume_written_right_after_a_close_opens_the_session_again() -> None:
    run_scenario(
        [
            New(0),
            Prompt(0, 0, "echo"),
            CloseThenOpen(0, 0, "session/load"),
            Prompt(0, 0, "hang"),
            CloseThenOpen(0, 0, "session/resume"),
            Prompt(0, 0, "echo"),
            # An untouched session: the close removes it, and the load finds nothing.
            New(0),
            CloseThenOpen(0, 1, "session/load"),
        ]
    )


def test_a_prompt_written_right_after_a_cancel_runs_after_the_cancelled_turn() -> None:
    run_scenario(
        [
            New(0),
            Prompt(0, 0, "hang"),
            CancelThenPrompt(0, 0, "echo"),
            Prompt(0, 0, "tool", "deferred"),
            CancelThenPrompt(0, 0, "tool"),
            CancelThenPrompt(0, 0, "hang"),
            CancelThenPrompt(0, 0, "echo"),
        ]
    )


def test_a_delegating_turn_ends_with_its_child_on_cancel_close_and_disconnect() -> None:
    run_scenario(
        [
            Initialize(0),
            New(0),
            Prompt(0, 0, "delegate"),
            Cancel(0, 0),
            Prompt(0, 0, "delegate"),
            Close(0, 0),
            Initialize(1),
            New(1),
            Prompt(1, 0, "delegate"),
            Disconnect(1),
            Load(0, 1),
            Prompt(0, 1, "delegate", then=0),
            Close(0, 1, then=1),
        ]
    )


def test_a_child_cancelled_alone_ends_and_its_parent_turn_goes_on() -> None:
    # A connection that declared subagents is told each child's id: a cancel naming it ends
    # the child alone, and the delegating turn ends its turn; a cancel of the parent, a
    # close, and a cancel naming a child that already ended change nothing more.
    run_scenario(
        [
            Initialize(0, subagents=True),
            New(0),
            Prompt(0, 0, "delegate"),
            CancelChild(0, 0),
            Prompt(0, 0, "delegate"),
            CancelChild(0, 0),
            CancelChild(0, 0),
            Prompt(0, 0, "delegate"),
            Cancel(0, 0),
            CancelChild(0, 0),
            Prompt(0, 0, "delegate"),
            Close(0, 0),
            Initialize(1, subagents=True),
            New(1),
            Prompt(1, 0, "delegate"),
            CancelChild(1, 0, then=0),
            Cancel(1, 0, then=1),
            Prompt(1, 0, "delegate"),
            CancelChild(1, 0, then=0),
            Close(1, 0),
        ]
    )


def test_a_revoked_delegating_turn_reports_its_child_ended() -> None:
    # The runtime revokes the session's lease (an account switch) while its connection
    # stays: the turn is answered cancelled, and its child must be reported idle first.
    run_scenario(
        [Initialize(0, subagents=True), New(0), Prompt(0, 0, "delegate"), SwitchAccount("bare")]
    )
