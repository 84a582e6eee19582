"""The fair-share gate of `round-robin-fairness-policy` (`overShareCeiling`, ours): a flow that has had more than an
equal share of its band's recent dispatches is held at a tighter ceiling, so a flow under its share finds room.
Pure decision code: time is an argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.app.config_file import load_config
from epp.config.flowcontrol import FlowControlSpec
from epp.errors import ConfigError
from epp.flowcontrol import FlowController, FlowSettings, QueuedRequest
from epp.flowcontrol.policies import RoundRobinFairness
from epp.scheduling import build_scheduler


def item(flow: str) -> QueuedRequest:
    return QueuedRequest(ticket=None, flow_id=flow)


def controller(over_share: float = 0.5, half_life_s: float = 10.0) -> FlowController:
    settings = FlowSettings(spec=FlowControlSpec())
    settings.fairness = lambda ref: RoundRobinFairness(over_share, half_life_s)
    return FlowController(settings)


def _heavy_has_dispatched(fc: FlowController, n: int, light: int, now: float) -> None:
    """Service history: `n` heavy and `light` light dispatches at `now`, with the pool idle."""
    for flow, count in (("heavy", n), ("light", light)):
        for _ in range(count):
            fc.enqueue(item(flow), now)
            assert fc.dispatch(0.0, now) is not None


def test_an_over_share_flow_is_held_at_the_tighter_ceiling_while_an_under_share_flow_goes_to_the_ceiling() -> None:
    fc = controller(over_share=0.5)
    _heavy_has_dispatched(fc, 10, 1, now=0.0)
    heavy, light = item("heavy"), item("light")
    fc.enqueue(heavy, 1.0)
    assert fc.dispatch(0.4, 1.0) is heavy  # below 0.5 × ceiling 1.0: nobody is held
    fc.enqueue(heavy2 := item("heavy"), 1.0)
    assert fc.dispatch(0.7, 1.0) is None and fc.count == 1  # heavy holds 11 of 12 dispatches: over its half
    fc.enqueue(light, 1.0)
    assert fc.dispatch(0.7, 1.0) is light  # light, under its share, dispatches up to the ceiling
    assert fc.dispatch(0.7, 1.0) is None
    assert fc.dispatch(1.0, 1.0) is None  # the band's own ceiling holds everyone
    assert fc.dispatch(0.3, 1.0) is heavy2


def test_a_flow_alone_in_its_band_is_never_over_its_share() -> None:
    fc = controller(over_share=0.5)
    _heavy_has_dispatched(fc, 20, 0, now=0.0)
    fc.enqueue(heavy := item("heavy"), 1.0)
    assert fc.dispatch(0.9, 1.0) is heavy  # share 1.0 of one flow: the full ceiling, no headroom kept for nobody


def test_shares_decay_so_a_flow_that_went_quiet_stops_costing_the_other_its_headroom() -> None:
    fc = controller(over_share=0.5, half_life_s=1.0)
    _heavy_has_dispatched(fc, 10, 1, now=0.0)
    fc.enqueue(heavy := item("heavy"), 0.0)
    assert fc.dispatch(0.7, 0.0) is None
    assert fc.dispatch(0.7, 6.0) is None  # light's one dispatch, 6 half-lives on: 0.016, still a share to keep
    # at 7 half-lives light's 0.008 is forgotten, heavy's 0.08 is remembered: heavy is alone in the band again
    assert fc.dispatch(0.7, 7.0) is heavy


def test_the_fast_path_counts_toward_the_shares_and_respects_the_gate() -> None:
    fc = controller(over_share=0.5)
    for _ in range(10):
        assert fc.pass_through(item("heavy"), 0.2, 0.0)
    assert fc.pass_through(item("light"), 0.2, 0.0)
    assert not fc.pass_through(item("heavy"), 0.7, 0.0)  # over its share above 0.5 × 1.0: it must queue
    assert fc.pass_through(item("light"), 0.7, 0.0)
    assert not fc.pass_through(item("light"), 1.0, 0.0)  # the band's ceiling


def test_the_default_over_share_ceiling_is_plain_round_robin() -> None:
    fc = controller(over_share=1.0)
    _heavy_has_dispatched(fc, 10, 1, now=0.0)
    fc.enqueue(heavy := item("heavy"), 1.0)
    assert fc.dispatch(0.99, 1.0) is heavy


_CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: round-robin-fairness-policy
  parameters: {PARAMS}
- {type: max-score-picker}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: max-score-picker}]}
flowControl: {defaultPriorityBand: {fairnessPolicyRef: round-robin-fairness-policy}}
"""


def test_the_gate_is_configured_on_the_round_robin_policy() -> None:
    text = _CONFIG.replace("{PARAMS}", "{overShareCeiling: 0.6, shareHalfLifeSeconds: 5}")
    settings = build_scheduler(load_config(None, text=text, warn=False)).flow
    assert settings is not None
    policy = settings.fairness(settings.spec.default_band.fairness_policy_ref)
    assert isinstance(policy, RoundRobinFairness) and policy.gate is not None
    assert policy.gate.over_share == pytest.approx(0.6) and policy.gate.service.half_life_s == pytest.approx(5.0)
    plain = build_scheduler(load_config(None, text=_CONFIG.replace("{PARAMS}", "{}"), warn=False)).flow
    assert plain is not None and plain.fairness("round-robin-fairness-policy").gate is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("params", ["{overShareCeiling: 0}", "{overShareCeiling: 1.5}", "{shareHalfLifeSeconds: 0}"])
def test_an_out_of_range_gate_parameter_is_refused(params: str) -> None:
    with pytest.raises(ConfigError):
        build_scheduler(load_config(None, text=_CONFIG.replace("{PARAMS}", params), warn=False))


def test_the_fair_share_option_file_is_the_threshold_file_with_only_the_gate_added() -> None:
    configs = Path(__file__).parents[2] / "benchmarks" / "configs"
    option = load_config(configs / "flow-control-fair-share.yaml", allow_experimental=True, warn=False)
    threshold = load_config(configs / "flow-control.yaml", allow_experimental=True, warn=False)
    gated = [p for p in option.plugins if p.parameters.get("overShareCeiling") is not None]
    assert [(p.type, dict(p.parameters)) for p in gated] == [
        ("round-robin-fairness-policy", {"overShareCeiling": 0.58})
    ]
    assert [p for p in option.plugins if p not in gated] == [p for p in threshold.plugins if p.name != gated[0].name]
    assert option.profiles == threshold.profiles and option.flow_control == threshold.flow_control
