"""Session affinity's two strategies (upstream's `scheduling/scorer/sessionaffinity`), and the token the response
carries back to the client through the ext_proc stream."""

import base64

import pytest

from epp.config.decode import parse_config
from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Director
from epp.errors import ConfigError
from epp.scheduling import build_scheduler
from epp.scheduling.affinity import SessionAffinityScorer
from tests.extproc.envoy import BODY, body_msg, headers_msg, make_stream, response_headers
from tests.scheduling.tables import NOW, request, state, table_with

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def _scheduler(params):
    doc = {
        **BASE,
        "plugins": [{"type": "session-affinity-scorer", "parameters": params}, {"type": "random-picker"}],
        "schedulingProfiles": [
            {"name": "p", "plugins": [{"pluginRef": "session-affinity-scorer"}, {"pluginRef": "random-picker"}]}
        ],
    }
    return build_scheduler(parse_config(doc, "cfg.yaml"), allow_experimental=True)


def test_encoded_endpoint_header_writes_the_endpoint_and_reads_it_back_without_state() -> None:
    """sessionaffinity/README.md: encoded_endpoint_header (default) is stateless; the response header carries the
    base64 of the chosen endpoint's name, which the client echoes in x-session-token."""
    snap = table_with([{}, {}, {}]).snapshot()
    written = SessionAffinityScorer().response_headers(snap, 2)
    assert written == (("x-session-token", base64.b64encode(b"pod-2").decode()),)
    fresh = SessionAffinityScorer()  # another replica: no memory of earlier picks
    st = state(snap, request("p", session=written[0][1]))
    assert fresh.score(st, snap.slots).tolist() == [0.0, 0.0, 1.0]


def test_upstream_form_namespace_slash_pod_is_read() -> None:
    """sessionaffinity/README.md: the token is base64 of namespace/name."""
    snap = table_with([{}, {}]).snapshot()
    token = base64.b64encode(b"default/pod-1").decode()
    assert SessionAffinityScorer().score(state(snap, request("p", session=token)), snap.slots).tolist() == [0, 1]


def test_session_id_strategy_binds_server_side_with_a_ttl() -> None:
    """upstream-2026 §1: strategy session_id keys a server-side binding by x-session-id, TTL 300 s by default;
    nothing is written back."""
    snap = table_with([{}, {}]).snapshot()
    scorer = SessionAffinityScorer(strategy="session_id")
    first = state(snap, request("p", headers={"x-session-id": "abc"}))
    assert scorer.score(first, snap.slots).tolist() == [0.0, 0.0]
    scorer.picked(first, 1)
    assert scorer.response_headers(snap, 1) == ()
    soon = state(snap, request("p", headers={"x-session-id": "abc"}), now=NOW + 299)
    assert scorer.score(soon, snap.slots).tolist() == [0.0, 1.0]
    scorer.picked(soon, 1)  # use refreshes the binding
    later = state(snap, request("p", headers={"x-session-id": "abc"}), now=NOW + 299 + 301)
    assert scorer.score(later, snap.slots).tolist() == [0.0, 0.0]
    other = state(snap, request("p", headers={"x-session-id": "zzz"}))
    assert scorer.score(other, snap.slots).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("params", "strategy", "header", "ttl"),
    [
        ({}, "encoded_endpoint_header", "x-session-token", 300.0),
        ({"strategy": "session_id"}, "session_id", "x-session-id", 300.0),
        ({"algorithm": "session_id_header", "evictionTtlSeconds": 600}, "session_id", "x-session-id", 600.0),
        ({"strategy": "session_id", "headerName": "X-My-Session", "ttl": "1m"}, "session_id", "x-my-session", 60.0),
    ],
)
def test_strategy_parameters(params, strategy, header, ttl) -> None:
    """sessionaffinity/README.md parameters (algorithm / strategy, headerName, evictionTtlSeconds)."""
    scorer = _scheduler(params).handler.profile.scorers[0].scorer
    assert (scorer.strategy, scorer.header, scorer.ttl_s) == (strategy, header, ttl)


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="strategy"):
        _scheduler({"strategy": "sticky"})


def test_the_response_carries_the_session_token_back_through_the_stream() -> None:
    """sessionaffinity/README.md: as a ResponseHeaderProcessor the scorer writes the header on the response."""
    table = EndpointTable()
    table.replace_all([EndpointInfo(address="127.10.0.1:8000", pod_name="pod-a")])
    table.synced = True
    director = Director(table, _scheduler({}), clock=lambda: NOW)
    stream, _, _ = make_stream(director)
    stream.handle(headers_msg())
    stream.handle(body_msg(BODY, True))
    out = stream.handle(response_headers("application/json"))
    mutation = out[0].response_headers.response.header_mutation
    written = {h.header.key: h.header.raw_value for h in mutation.set_headers}
    assert written == {"x-session-token": base64.b64encode(b"pod-a")}
