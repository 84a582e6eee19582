"""The llm-d role filters keep the pods upstream keeps.

Facts from llm-d-router @ebab687927f5 `pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go`: the label is
`llm-d.ai/role`; `decode-filter` keeps decode, prefill-decode, both, encode-prefill-decode and pods without the
label; `prefill-filter` keeps prefill, encode-prefill, prefill-decode, both, encode-prefill-decode; `encode-filter`
keeps encode, encode-prefill, encode-prefill-decode; neither of the last two keeps unlabelled pods.
"""

import pytest

from epp.config.decode import parse_config
from epp.scheduling import build_scheduler
from tests.scheduling.tables import state, table_with

ROLES = [
    "decode",
    "prefill",
    "encode",
    "prefill-decode",
    "encode-prefill",
    "encode-prefill-decode",
    "both",
    None,  # no role label
    "gpu",  # a value no filter knows
]

KEEPS = {
    "decode-filter": {"decode", "prefill-decode", "both", "encode-prefill-decode", None},
    "prefill-filter": {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"},
    "encode-filter": {"encode", "encode-prefill", "encode-prefill-decode"},
}


def _scheduler(filter_type: str):
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": filter_type}, {"type": "random-picker"}],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": filter_type}, {"pluginRef": "random-picker"}]}
        ],
    }
    return build_scheduler(parse_config(doc, "roles.yaml"))


@pytest.mark.parametrize("filter_type", sorted(KEEPS))
def test_role_filter_keeps_upstreams_role_set(filter_type) -> None:
    labels = [{"llm-d.ai/role": r} if r is not None else {} for r in ROLES]
    snap = table_with([{}] * len(ROLES), labels=labels).snapshot()
    (role_filter,) = _scheduler(filter_type).handler.profile.filters
    kept = {ROLES[i] for i in role_filter.filter(state(snap), snap.slots).tolist()}
    assert kept == KEEPS[filter_type]
