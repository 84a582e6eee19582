"""Label filters: keep endpoints whose labels satisfy a predicate (a pool subset, or llm-d's P/D roles).

Labels change only with membership, so the keep-mask over all slots is computed once per snapshot version and a
pick costs one boolean index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import BoolArray, IntArray
from epp.scheduling.framework import CycleState

ROLE_LABEL = "llm-d.ai/role"  # llm-d's prefill/decode role label

LabelPredicate = Callable[[Mapping[str, str]], bool]


def match_labels(wanted: Mapping[str, str]) -> LabelPredicate:
    items = tuple(wanted.items())
    return lambda labels: all(labels.get(k) == v for k, v in items)


def label_in(label: str, valid: tuple[str, ...], allow_missing: bool) -> LabelPredicate:
    allowed = frozenset(valid)

    def predicate(labels: Mapping[str, str]) -> bool:
        value = labels.get(label)
        return allow_missing if value is None else value in allowed

    return predicate


SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


Expression = tuple[str, str, frozenset[str]]  # (key, operator, values) of a matchExpressions item


def label_selector(wanted: Mapping[str, str], expressions: tuple[Expression, ...]) -> LabelPredicate:
    """A Kubernetes label selector: every matchLabels pair and every (key, operator, values) expression must hold.
    In: the key is set to one of the values; NotIn: unset, or set to none of them; Exists / DoesNotExist: set / not."""
    items = tuple(wanted.items())

    def predicate(labels: Mapping[str, str]) -> bool:
        if not all(labels.get(k) == v for k, v in items):
            return False
        for key, operator, values in expressions:
            value = labels.get(key)
            if operator == "In":
                ok = value is not None and value in values
            elif operator == "NotIn":
                ok = value is None or value not in values
            elif operator == "Exists":
                ok = value is not None
            else:
                ok = value is None
            if not ok:
                return False
        return True

    return predicate


class LabelFilter:
    """Keeps candidates whose endpoint labels satisfy `predicate`; may return none (no endpoint fits)."""

    def __init__(self, type_name: str, name: str, predicate: LabelPredicate) -> None:
        self.type_name = type_name
        self.name = name
        self._predicate = predicate
        self._version = -1
        self._mask: BoolArray = np.zeros(0, dtype=np.bool_)

    def _keep_mask(self, snapshot: Snapshot) -> BoolArray:
        if snapshot.version != self._version or self._mask.size != len(snapshot.infos):
            self._mask = np.fromiter(
                (info is not None and self._predicate(info.labels) for info in snapshot.infos),
                dtype=np.bool_,
                count=len(snapshot.infos),
            )
            self._version = snapshot.version
        return self._mask

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        return self.keep(state.snapshot, candidates)

    def keep(self, snapshot: Snapshot, candidates: IntArray) -> IntArray:
        """The filter without a pick's state: which candidates a stage may use (the saturation of each stage)."""
        return candidates[self._keep_mask(snapshot)[candidates]]


# The role sets of llm-d's role filters (llm-d-router pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go):
# a pod serves every stage its role names. Only decode keeps pods without the role label.
DECODE_ROLES = ("decode", "prefill-decode", "both", "encode-prefill-decode")
PREFILL_ROLES = ("prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode")
ENCODE_ROLES = ("encode", "encode-prefill", "encode-prefill-decode")


def decode_filter(name: str) -> LabelFilter:
    """`decode-filter`: roles that decode; an endpoint without the role label serves decode too."""
    return LabelFilter("decode-filter", name, label_in(ROLE_LABEL, DECODE_ROLES, allow_missing=True))


def prefill_filter(name: str) -> LabelFilter:
    """`prefill-filter`: roles that prefill; unlabelled endpoints are not prefill workers."""
    return LabelFilter("prefill-filter", name, label_in(ROLE_LABEL, PREFILL_ROLES, allow_missing=False))


def encode_filter(name: str) -> LabelFilter:
    """`encode-filter`: roles that encode (multimodal inputs); unlabelled endpoints are not encoders."""
    return LabelFilter("encode-filter", name, label_in(ROLE_LABEL, ENCODE_ROLES, allow_missing=False))
