"""The compiled `envoy.lb` metadata (epp/extproc/_metadata.c) is `decision_metadata`'s (epp.extproc.messages): the
same message, written into a fresh answer or merged into a copy of a memoized one, on random inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp import wire
from epp.extproc import messages
from epp.extproc.messages import DecisionAnswers, decision_metadata, write_metadata

compiled = messages._METADATA
needs_native = pytest.mark.skipif(compiled is None, reason="the C extension is not built (or EPP_NATIVE=0)")

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=300)
score = st.floats(allow_nan=False, allow_infinity=True, width=64)
scores = st.lists(st.tuples(text, score), max_size=70).map(tuple)
receipts = st.none() | st.just("") | text


@needs_native
@settings(max_examples=400, deadline=None)
@given(text, scores, receipts)
def test_the_compiled_metadata_is_the_python_definition(
    destination: str, pairs: tuple[tuple[str, float], ...], receipt: str | None
) -> None:
    expected = messages.ProcessingResponse()
    decision_metadata(expected, destination, pairs, receipt)
    got = messages.ProcessingResponse()
    write_metadata(got, destination, pairs, receipt)
    assert got == expected
    assert not (destination or pairs or receipt) or (
        compiled is not None
        and compiled.lb_metadata(
            None,
            wire.LB_NAMESPACE,
            wire.DESTINATION_HEADER,
            destination,
            wire.DESTINATION_SCORES_KEY,
            pairs,
            wire.ROUTE_RECEIPT_KEY,
            receipt,
        ).__class__
        is bytes
    )


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["headers", "body"]), text.filter(bool), scores, receipts)
def test_a_memoized_answer_with_scores_and_a_receipt_is_the_python_definitions(
    phase: str, destination: str, pairs: tuple[tuple[str, float], ...], receipt: str | None
) -> None:
    answers = DecisionAnswers()
    headers = ((wire.DESTINATION_HEADER, destination),)
    cached = answers.decision(phase, headers, destination)
    assert isinstance(cached, messages.EncodedAnswer)  # the memoized answer is handed out as its bytes
    got = answers.decision(phase, headers, destination, scores=pairs, receipt=receipt)
    expected = messages.ProcessingResponse()
    expected.CopyFrom(cached.message())
    decision_metadata(expected, "", pairs, receipt)
    assert got == expected
    # Held as its bytes (neither parsed nor encoded again): the memoized answer's, then the metadata's, which a
    # reader merges into the same message (the envoy.lb entry replaces the memoized one's).
    assert isinstance(got, messages.EncodedAnswer)
    assert got.SerializeToString() == messages.serialize(got)
    assert got.SerializeToString().startswith(cached.SerializeToString())
    assert messages.ProcessingResponse.FromString(got.SerializeToString()) == expected
    assert answers.decision(phase, headers, destination) == cached  # the memoized one is not written into
    assert messages.with_metadata(cached.SerializeToString(), destination, pairs, receipt) in (expected, None)
    fresh = answers.decision(phase, headers, destination, cacheable=False, scores=pairs, receipt=receipt)
    assert fresh == expected


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["headers", "body"]), text.filter(bool), scores, receipts, scores, text.filter(bool))
def test_entries_written_already_are_copied_as_the_python_definition_merges_them(
    phase: str,
    destination: str,
    pairs: tuple[tuple[str, float], ...],
    receipt: str | None,
    entry_pairs: tuple[tuple[str, float], ...],
    entry_receipt: str,
) -> None:
    """`entries` (a route receipt's `envoy.lb` entries as bytes, `lb_entries_python`'s) are what
    `decision_metadata` merges in last: the compiled call copies them as they are, the same message; an answer
    given them with their receipt writes that receipt only there."""
    entries = messages.lb_entries_python(entry_pairs, entry_receipt)
    expected = messages.ProcessingResponse()
    decision_metadata(expected, destination, pairs, receipt, entries)
    got = messages.ProcessingResponse()
    write_metadata(got, destination, pairs, receipt, entries)
    assert got == expected
    answers = DecisionAnswers()
    headers = ((wire.DESTINATION_HEADER, destination),)
    cached = answers.decision(phase, headers, destination)
    assert isinstance(cached, messages.EncodedAnswer)
    answer = answers.decision(phase, headers, destination, scores=pairs, receipt=entry_receipt, entries=entries)
    memoized = messages.ProcessingResponse()
    memoized.CopyFrom(cached.message())
    decision_metadata(memoized, "", pairs, None, entries)
    assert answer == memoized
    assert isinstance(answer, messages.EncodedAnswer)
    fresh = answers.decision(
        phase, headers, destination, cacheable=False, scores=pairs, receipt=entry_receipt, entries=entries
    )
    assert fresh == memoized


@needs_native
def test_a_nan_score_is_written_as_the_python_code_writes_it() -> None:
    got = messages.ProcessingResponse()
    write_metadata(got, "10.0.0.1:8000", (("10.0.0.1:8000", math.nan), ("10.0.0.2:8000", -0.0)), None)
    lb = got.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields
    by_address = lb[wire.DESTINATION_SCORES_KEY].struct_value.fields
    assert math.isnan(by_address["10.0.0.1:8000"].number_value)
    assert math.copysign(1.0, by_address["10.0.0.2:8000"].number_value) == -1.0
    assert lb[wire.DESTINATION_HEADER].string_value == "10.0.0.1:8000"


@needs_native
def test_scores_of_another_shape_run_the_python_code() -> None:
    assert compiled is not None
    args = (None, wire.LB_NAMESPACE, wire.DESTINATION_HEADER, "a", wire.DESTINATION_SCORES_KEY)
    assert compiled.lb_metadata(*args, (("a", 1),), wire.ROUTE_RECEIPT_KEY, None) is NotImplemented
    assert compiled.lb_metadata(*args, [("a", 1.0)], wire.ROUTE_RECEIPT_KEY, None) is NotImplemented
    got = messages.ProcessingResponse()
    write_metadata(got, "a", (("a", 1),), None)
    expected = messages.ProcessingResponse()
    decision_metadata(expected, "a", (("a", 1),), None)
    assert got == expected


def test_an_encoded_answer_reads_as_its_message() -> None:
    message = messages.ProcessingResponse()
    decision_metadata(message, "10.0.0.1:8000", (("10.0.0.1:8000", 1.5),), '{"chosen":"10.0.0.1:8000"}')
    answer = messages.EncodedAnswer(message.SerializeToString())
    assert answer == message and message == answer and answer == messages.EncodedAnswer(message.SerializeToString())
    assert answer.WhichOneof("response") is None
    lb = answer.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields
    assert lb[wire.ROUTE_RECEIPT_KEY].string_value == '{"chosen":"10.0.0.1:8000"}'
    assert messages.serialize(message) == message.SerializeToString() == answer.SerializeToString()
