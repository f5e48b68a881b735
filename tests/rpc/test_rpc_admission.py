"""Admission order: ``AdmissionOrder`` on its own (sans-I/O), then the peer over a real socket
pair: requests written together decide in arrival order whatever order Trio starts their
tasks in, a request's work goes on after it is admitted, and a notification's action waits
for the requests before it."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from maple_acp.rpc import EVERYTHING, AdmissionOrder, JsonRpcPeer, Params, admitted

HANG_GUARD_S = 10

# --- AdmissionOrder -------------------------------------------------------------------------


def test_a_request_waits_only_for_earlier_ones_with_its_key() -> None:
    order = AdmissionOrder()
    order.enter(1, "a")
    order.enter(2, "b")
    order.enter(3, "a")
    order.enter(4, None)
    assert [order.ready(t) for t in (1, 2, 3, 4)] == [True, True, False, True]
    order.admit(1)
    assert order.ready(3)
    assert len(order) == 3


def test_everything_is_ordered_against_every_request_both_ways() -> None:
    order = AdmissionOrder()
    order.enter(1, None)
    order.enter(2, EVERYTHING)
    order.enter(3, "a")
    order.enter(4, None)
    assert [order.ready(t) for t in (1, 2, 3, 4)] == [True, False, False, False]
    order.admit(1)
    assert [order.ready(t) for t in (2, 3, 4)] == [True, False, False]
    order.admit(2)
    assert [order.ready(t) for t in (3, 4)] == [True, True]


def test_admitting_twice_or_an_unknown_ticket_changes_nothing() -> None:
    order = AdmissionOrder()
    order.enter(1, "a")
    order.enter(2, "a")
    assert order.admit(1) == []
    assert order.admit(1) == []
    assert order.admit(99) == []
    assert order.ready(2)


def test_tickets_must_grow() -> None:
    order = AdmissionOrder()
    order.enter(5, "a")
    with pytest.raises(ValueError, match="arrival order"):
        order.enter(5, "b")


def test_a_deferred_action_runs_once_the_requests_before_it_are_admitted() -> None:
    order = AdmissionOrder()
    ran: list[str] = []
    order.enter(1, "a")
    order.enter(2, "b")
    assert not order.defer(3, "b-unrelated", lambda: ran.append("now"))
    assert order.defer(3, "a", lambda: ran.append("first"))
    # A later one with the same key keeps its place behind it, even when nothing else holds it.
    order.admit(2)
    assert order.defer(4, "a", lambda: ran.append("second"))
    order.enter(5, "a")
    for callback in order.admit(1):
        callback()
    assert ran == ["first", "second"]
    assert order.ready(5)


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", None, EVERYTHING]), st.booleans()), max_size=12),
    st.randoms(use_true_random=False),
)
def test_admitting_in_any_order_lets_each_decide_after_every_conflicting_earlier_one(
    entries: list[tuple[Any, bool]], rng: Any
) -> None:
    # Each ticket is a request (or, when flagged, a deferred action); whatever order the
    # requests are admitted in, nothing decides before an earlier conflicting request did.
    order = AdmissionOrder()
    decided: list[int] = []
    keys: dict[int, Any] = {}
    open_tickets: list[int] = []
    for ticket, (key, deferred) in enumerate(entries, start=1):
        keys[ticket] = key
        if deferred:
            if not order.defer(ticket, key, partial(decided.append, ticket)):
                decided.append(ticket)
        else:
            order.enter(ticket, key)
            open_tickets.append(ticket)
    while open_tickets:
        ready = [t for t in open_tickets if order.ready(t)]
        assert ready, "some request must always be able to decide"
        ticket = rng.choice(ready)
        open_tickets.remove(ticket)
        decided.append(ticket)
        for callback in order.admit(ticket):
            callback()
    assert sorted(decided) == list(range(1, len(entries) + 1))

    def conflict(a: Any, b: Any) -> bool:
        return a is EVERYTHING or b is EVERYTHING or (a is not None and a == b)

    position = {ticket: index for index, ticket in enumerate(decided)}
    for later in keys:
        for earlier in range(1, later):
            if conflict(keys[earlier], keys[later]) and not entries[earlier - 1][1]:
                assert position[earlier] < position[later], (earlier, later, decided)


# --- the peer -------------------------------------------------------------------------------


class Decisions(list[str]):
    """The names of the requests (and notices) in the order they decided."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = trio.Event()

    def add(self, name: str) -> None:
        self.append(name)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, count: int) -> None:
        with trio.fail_after(HANG_GUARD_S):
            while len(self) < count:
                await self._changed.wait()


@asynccontextmanager
async def ordered_peer(
    decisions: Decisions, gate: trio.Event
) -> AsyncIterator[tuple[JsonRpcPeer, trio.SocketStream]]:
    """A peer whose ``claim`` requests record their decision, admit, then wait for ``gate``
    (their work, which goes on after they are admitted); ``slow`` requests decide only after
    a few scheduler passes, holding the ones ordered behind them."""

    async def on_request(method: str, params: Params) -> Any:
        assert isinstance(params, dict)
        if method == "slow":
            for _ in range(5):
                await trio.lowlevel.checkpoint()
        decisions.add(params["name"])
        if method == "claim":
            admitted()
            await gate.wait()
        return params["name"]

    def key(method: str, params: Params) -> Any:
        if method == "everything":
            return EVERYTHING
        return params.get("key") if isinstance(params, dict) else None

    async def on_notification(method: str, params: Params) -> None:
        # What a cancel does: act once the requests before it (with its key) decided.
        assert isinstance(params, dict)
        peer.in_order(params["key"], partial(decisions.add, params["name"]))

    ours, theirs = socket.socketpair()
    peer = JsonRpcPeer(
        trio.SocketStream(trio.socket.from_stdlib_socket(ours)),
        on_request=on_request,
        on_notification=on_notification,
        order_key=key,
    )
    far = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    with trio.fail_after(HANG_GUARD_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            yield peer, far
            await peer.aclose()
            await far.aclose()


def lines(*requests: tuple[str, str, Any]) -> bytes:
    return b"".join(
        orjson.dumps(
            {"jsonrpc": "2.0", "id": name, "method": method, "params": {"name": name, "key": key}}
        )
        + b"\n"
        for method, name, key in requests
    )


async def read_answers(far: trio.SocketStream, count: int) -> dict[str, Any]:
    buffer = b""
    while buffer.count(b"\n") < count:
        buffer += await far.receive_some(65536)
    return {m["id"]: m for m in map(orjson.loads, buffer.splitlines())}


async def test_requests_with_one_key_decide_in_arrival_order_every_time() -> None:
    for _ in range(50):
        decisions = Decisions()
        gate = trio.Event()
        async with ordered_peer(decisions, gate) as (_peer, far):
            await far.send_all(
                lines(
                    ("slow", "s1", "a"),
                    ("claim", "c2", "a"),
                    ("echo", "e3", "a"),
                    ("echo", "other", "b"),
                    ("everything", "all", None),
                    ("echo", "after", "a"),
                )
            )
            await decisions.wait_for(6)
            gate.set()
            answers = await read_answers(far, 6)
        # "other" may decide whenever; the rest keep their order, and c2 decided while its
        # work was still waiting for the gate.
        keyed = [name for name in decisions if name != "other"]
        assert keyed == ["s1", "c2", "e3", "all", "after"]
        assert decisions.index("other") < decisions.index("all")
        assert answers["c2"]["result"] == "c2"


async def test_a_notification_action_waits_for_the_requests_before_it() -> None:
    for _ in range(20):
        decisions = Decisions()
        gate = trio.Event()
        async with ordered_peer(decisions, gate) as (_peer, far):
            notices = [
                {"jsonrpc": "2.0", "method": "n", "params": {"name": name, "key": key}}
                for name, key in (("notice", "a"), ("unrelated", "b"))
            ]
            await far.send_all(
                lines(("slow", "s1", "a"), ("claim", "c2", "a"))
                + b"".join(orjson.dumps(n) + b"\n" for n in notices)
            )
            await decisions.wait_for(4)
            gate.set()
            await read_answers(far, 2)
        assert [name for name in decisions if name != "unrelated"] == ["s1", "c2", "notice"]


async def test_a_request_cancelled_while_waiting_for_its_turn_lets_the_next_decide() -> None:
    decisions = Decisions()
    gate = trio.Event()
    async with ordered_peer(decisions, gate) as (_peer, far):
        await far.send_all(lines(("claim", "c1", "a"), ("echo", "e2", "a"), ("echo", "e3", "a")))
        await decisions.wait_for(1)
        cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "c1"}}
        await far.send_all(orjson.dumps(cancel) + b"\n")
        answers = await read_answers(far, 3)
    assert answers["c1"]["error"]["code"] == -32800
    assert decisions == ["c1", "e2", "e3"]
