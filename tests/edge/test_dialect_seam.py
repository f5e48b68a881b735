"""What both protocol versions share, decided once in the dialect seam: a client's permission
answer as the runtime takes it, and the stop reason of a finished run."""

from __future__ import annotations

import pytest

from maple_acp.edge._dialect import PERMISSION_OPTIONS, permission_answer, stop_reason
from maple_acp.runtime import PermissionAnswer, RunState, StopReason
from maple_acp.wire import RequestPermissionResponse, structure_params


def _response(outcome: object) -> RequestPermissionResponse:
    return structure_params({"outcome": outcome}, RequestPermissionResponse)


def test_only_our_two_options_become_answers() -> None:
    assert [option.option_id for option in PERMISSION_OPTIONS] == ["allow_once", "reject_once"]
    allow = _response({"outcome": "selected", "optionId": "allow_once"})
    reject = _response({"outcome": "selected", "optionId": "reject_once"})
    assert permission_answer(allow) is PermissionAnswer.ALLOW_ONCE
    assert permission_answer(reject) is PermissionAnswer.DENY_ONCE


@pytest.mark.parametrize(
    "outcome",
    [
        {"outcome": "selected", "optionId": "allow_always"},
        {"outcome": "selected", "optionId": "deny_once"},
        {"outcome": "selected", "optionId": ""},
        {"outcome": "cancelled"},
    ],
)
def test_every_other_answer_fails_closed(outcome: object) -> None:
    assert permission_answer(_response(outcome)) is None


def test_the_stop_reason_of_a_finished_run() -> None:
    assert stop_reason(RunState.CANCELLED, StopReason.MAX_TOKENS) == "cancelled"
    assert stop_reason(RunState.COMPLETED, StopReason.MAX_TOKENS) == "max_tokens"
    assert stop_reason(RunState.COMPLETED, StopReason.REFUSAL) == "refusal"
    # A failed run's text was already shown: answering normally keeps a client from retrying.
    assert stop_reason(RunState.FAILED, StopReason.END_TURN) == "end_turn"
