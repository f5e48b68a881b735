"""The project-trust dialog, asked right before the first prompt of a session that needs it.

With a client that advertised form elicitation: ``elicitation/create`` with one required
boolean (default false); decline keeps the project untrusted, cancel cancels the turn, and a
failed elicitation falls back to the chooser. Otherwise: a permission chooser with three
options in this order — keep trust disabled, trust this project (both allow kind, so a
client's generic auto-accept cannot decide trust silently) and cancel turn (reject kind).

Resource handling: each question holds its outbound credit until answered (the client
channel's rule). Error handling: a failed or malformed elicitation falls back to the chooser;
a failed or malformed chooser answer cancels the turn; nothing is saved for either.
Cancellation: a close or a cancel of the prompt ends the question (the turn's abortable
scope) with nothing saved.
"""

from __future__ import annotations

import logging
from typing import Final

from maple_acp.edge._client import ClientChannel
from maple_acp.edge._session import EdgeSession
from maple_acp.rpc import ConnectionClosed, OutboundFrameTooLarge
from maple_acp.wire import (
    INVALID_PARAMS,
    BooleanPropertySchema,
    CreateElicitationRequest,
    ElicitationAccept,
    ElicitationDecline,
    ElicitationSchema,
    PermissionOption,
    ProtocolError,
    SelectedPermissionOutcome,
)

logger = logging.getLogger(__name__)

_TRUST_KEEP: Final = "keep_disabled"
_TRUST_YES: Final = "trust"
_TRUST_CANCEL: Final = "cancel_turn"
#: The chooser's options, in this order (see the module docstring).
TRUST_OPTIONS: Final = (
    PermissionOption(option_id=_TRUST_KEEP, name="Keep project trust disabled", kind="allow_once"),
    PermissionOption(option_id=_TRUST_YES, name="Trust this project", kind="allow_once"),
    PermissionOption(option_id=_TRUST_CANCEL, name="Cancel turn", kind="reject_once"),
)
_TRUST_FIELD: Final = "trustProject"
_QUESTION: Final = (
    "This project contains agent skills (.agents/skills). Trust this project so "
    "that its skills are visible to the model?"
)


class TrustDialog:
    """Settles project trust for the sessions of one connection."""

    def __init__(self, channel: ClientChannel) -> None:
        self._channel = channel

    async def settle(self, session: EdgeSession) -> bool:
        """Ask when the project needs a decision and save it; False if the turn is cancelled."""
        lease = session.lease
        status = await lease.trust_status()
        if not status.decision_needed:
            return True
        decision = await self._ask(session)
        if decision is None:
            return False
        await lease.decide_trust(decision)
        return True

    async def _ask(self, session: EdgeSession) -> bool | None:
        """The trust decision: True/False, or None to cancel the turn."""
        if self._channel.features.elicitation_form:
            try:
                return await self._elicit(session)
            except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
                logger.info("trust elicitation failed, asking with a chooser: %s", exc)
        return await self._choose(session)

    async def _elicit(self, session: EdgeSession) -> bool | None:
        params = CreateElicitationRequest(
            session_id=session.id,
            message=_QUESTION,
            requested_schema=ElicitationSchema(
                properties={
                    _TRUST_FIELD: BooleanPropertySchema(title="Trust this project", default=False)
                },
                required=(_TRUST_FIELD,),
            ),
        )
        response = await self._channel.elicit(session.id, params)
        if isinstance(response, ElicitationAccept):
            value = (response.content or {}).get(_TRUST_FIELD)
            if not isinstance(value, bool):
                raise ProtocolError(INVALID_PARAMS, "the trust answer is not a boolean")
            return value
        if isinstance(response, ElicitationDecline):
            return False
        return None

    async def _choose(self, session: EdgeSession) -> bool | None:
        params = session.projector.question(
            f"project-trust-{session.id}",
            "Trust this project? It contains agent skills (.agents/skills).",
            TRUST_OPTIONS,
        )
        try:
            response = await self._channel.request_permission(session.id, params)
        except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
            logger.info("trust chooser failed; cancelling the turn: %s", exc)
            return None
        outcome = response.outcome
        if isinstance(outcome, SelectedPermissionOutcome):
            if outcome.option_id == _TRUST_KEEP:
                return False
            if outcome.option_id == _TRUST_YES:
                return True
        return None
