"""Label selectors in text form: the API machinery's grammar (as `kubectl -l` and upstream's --endpoint-selector).

The expectations are the documented meaning of Kubernetes label selectors: `=`/`==`/`in` need the label with
one of the values; `!=`/`notin` hold when the label is absent too; a bare key needs it present, `!key` absent;
`>`/`<` compare integers; commas AND the requirements; an empty value is allowed (`k=`, `k in ()`).
"""

from __future__ import annotations

import re

import pytest

from epp.datastore.pool import PoolSpec
from epp.datastore.selector import SelectorError, parse_label_selector, selector_matches


def matches(text: str, labels: dict[str, str]) -> bool:
    return selector_matches(parse_label_selector(text), labels)


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("app=vllm", {"app": "vllm"}, True),
        ("app==vllm", {"app": "vllm"}, True),
        ("app=vllm", {"app": "sglang"}, False),
        ("app=vllm", {}, False),
        ("tier!=frontend", {"tier": "backend"}, True),
        ("tier!=frontend", {}, True),
        ("tier!=frontend", {"tier": "frontend"}, False),
        ("env in (prod,staging)", {"env": "staging"}, True),
        ("env in (prod,staging)", {"env": "dev"}, False),
        ("env in (prod,staging)", {}, False),
        ("env notin (dev)", {"env": "prod"}, True),
        ("env notin (dev)", {}, True),
        ("env notin (dev)", {"env": "dev"}, False),
        ("gpu", {"gpu": ""}, True),
        ("gpu", {}, False),
        ("!canary", {}, True),
        ("!canary", {"canary": "true"}, False),
        ("rank>3", {"rank": "4"}, True),
        ("rank>3", {"rank": "3"}, False),
        ("rank<3", {"rank": "-1"}, True),
        ("rank>3", {"rank": "four"}, False),
        ("rank>3", {}, False),
        ("k=", {"k": ""}, True),
        ("k=", {"k": "x"}, False),
        ("k in ()", {"k": ""}, True),
        ("k in (a,)", {"k": ""}, True),
        ("app=vllm,!canary", {"app": "vllm"}, True),
        ("app=vllm,!canary", {"app": "vllm", "canary": "1"}, False),
        ("a=1,a=2", {"a": "1"}, False),
        ("llm-d.ai/role in (decode, both)", {"llm-d.ai/role": "both"}, True),
        ("  app = vllm ,  env notin(dev)  ", {"app": "vllm"}, True),
        ("in in (in, notin)", {"in": "notin"}, True),
    ],
)
def test_a_selector_means_what_it_means_to_the_api_server(text: str, labels: dict[str, str], expected: bool) -> None:
    assert matches(text, labels) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,", "expected: identifier after ','"),
        (",a", "expected: !, identifier"),
        ("a=b c", "expected: ',' or 'end of string'"),
        ("!a=b", "expected: ',' or 'end of string'"),
        ("env in (a", "expected: ',', ')' or identifier"),
        ("env in a", "expected: '('"),
        ("env in (a b)", "expected: ',', ')' or identifier"),
        ("a=(", "found '(', expected: identifier"),
        ("a <> b", "found '>', expected: identifier"),
        ("rank>x", "must be an integer"),
        ("Upper.Case/x=y", "prefix of a label key"),
        ("a/b/c=d", "prefix of a label key"),
        ("-a=b", "label key's name"),
        ("a=" + "v" * 64, "not a label value"),
        ("a=-b", "not a label value"),
    ],
)
def test_a_malformed_selector_is_refused_with_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(message)):
        parse_label_selector(text)


def test_the_text_form_round_trips() -> None:
    text = "app=vllm,env in (prod,staging),tier notin (x),gpu,!canary,zone!=b,rank>3,k=="
    again = ",".join(str(r) for r in parse_label_selector(text))
    assert parse_label_selector(again) == parse_label_selector(text)


def test_a_pool_selects_by_its_pairs_and_its_expressions_and_an_empty_one_selects_nothing() -> None:
    pool = PoolSpec("p", selector={"app": "vllm"}, expressions=parse_label_selector("!canary"))
    assert pool.selects({"app": "vllm"})
    assert not pool.selects({"app": "vllm", "canary": "1"})
    assert not PoolSpec("p").selects({"app": "vllm"})
    assert PoolSpec("p", expressions=parse_label_selector("gpu")).selects({"gpu": "a"})
