"""Where an ext_proc stream stands (`Phase`), and the words its out-of-order refusals use.

The table is the stream's (`epp.extproc.stream.TRANSITIONS`): for each phase, the message kinds that may
arrive, the action that answers each, and the phases it may lead to. Pure: no I/O.
"""

from __future__ import annotations

import enum


class Phase(enum.IntEnum):
    """Where a stream stands; the names say what the stream waits for."""

    REQUEST_HEADERS = 0  # nothing has arrived yet
    REQUEST_BODY = 1  # headers seen, the body (and trailers) to come; not decided
    REQUEST_PASS = 2  # decided on the headers (STREAMED); the body chunks pass through
    DECIDING = 3  # the stream asked for its decision (NeedDecision); `resume` answers with it
    RESPONSE_HEADERS = 4  # decided; request trailers may still come, then the response
    RESPONSE_BODY = 5  # response headers seen; body chunks flow
    RESPONSE_DONE = 6  # the response ended
    FINISHED = 7  # an ImmediateResponse was sent, or the server gave up: every message is ignored


PHASE_WORDS = {
    Phase.REQUEST_HEADERS: "before request_headers",
    Phase.REQUEST_BODY: "while the request body is still arriving",
    Phase.REQUEST_PASS: "while the request body is passing through",
    Phase.DECIDING: "while the request was being decided",
    Phase.RESPONSE_HEADERS: "after the request was complete and before the response",
    Phase.RESPONSE_BODY: "while the response body is arriving",
    Phase.RESPONSE_DONE: "after the response ended",
}


def out_of_order(kind: str | None, phase: Phase) -> str:
    """The reason of the 400 that answers a message the table does not list for the phase."""
    if kind is None:
        return "ext_proc message without a known kind"
    return f"ext_proc message {kind} {PHASE_WORDS[phase]}"
