"""Which API group's InferenceObjective / InferenceModelRewrite objects count, as the lists answer one by one.

Upstream picks the group from API discovery before it watches: llm-d.ai when that CRD is installed, the older
inference.networking.x-k8s.io only when it is not. The picker lists both; until llm-d.ai's list has answered, the
older group's objects must not count, or a picker whose older list lands first routes for a moment by rules
upstream never applies."""

from __future__ import annotations

from epp.discovery.kubernetes.objectives import LEGACY_GROUP, PREFERRED_GROUP, group_in_force


def test_nothing_counts_while_no_list_has_answered() -> None:
    assert group_in_force({}) is None
    assert group_in_force({PREFERRED_GROUP: None, LEGACY_GROUP: None}) is None


def test_the_older_group_waits_for_llm_d_ai_to_answer() -> None:
    assert group_in_force({LEGACY_GROUP: True}) is None
    assert group_in_force({PREFERRED_GROUP: None, LEGACY_GROUP: True}) is None


def test_llm_d_ai_counts_once_served_whatever_the_older_group_says() -> None:
    assert group_in_force({PREFERRED_GROUP: True}) == PREFERRED_GROUP
    assert group_in_force({PREFERRED_GROUP: True, LEGACY_GROUP: True}) == PREFERRED_GROUP
    assert group_in_force({PREFERRED_GROUP: True, LEGACY_GROUP: False}) == PREFERRED_GROUP


def test_the_older_group_counts_when_llm_d_ai_is_not_served() -> None:
    assert group_in_force({PREFERRED_GROUP: False, LEGACY_GROUP: True}) == LEGACY_GROUP
    assert group_in_force({PREFERRED_GROUP: False, LEGACY_GROUP: None}) is None
    assert group_in_force({PREFERRED_GROUP: False, LEGACY_GROUP: False}) is None
