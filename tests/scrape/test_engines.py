"""Engine mappings: each engine's page gives its signals; what a page does not say stays unknown (NaN)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from epp.errors import ConfigError
from epp.scrape.engines import BUILTIN_ENGINES, EngineRegistry, SeriesSpec, engines_from_config, extract
from tests.scrape.vllm_page import vllm_page


def nan_to_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def signals(text: str, engine: str) -> dict[str, object]:
    s = extract(text, EngineRegistry().for_engine(engine)).sample
    return {
        "waiting": nan_to_none(s.waiting),
        "running": nan_to_none(s.running),
        "kv": nan_to_none(s.kv_usage),
        "max_lora": nan_to_none(s.max_lora),
        "block_size": nan_to_none(s.block_size),
        "num_blocks": nan_to_none(s.num_blocks),
    }


@pytest.mark.parametrize(
    ("file", "engine", "expected"),
    [
        (
            "triton-trtllm-tensorrtllm_backend-readme-ifb.txt",
            "triton-tensorrt-llm",
            {"waiting": 1.0, "running": 1.0, "kv": 0.4875, "block_size": 64.0, "num_blocks": 6239.0},
        ),
        ("sglang-docs-production_metrics.txt", "sglang", {"kv": 0.28}),
        # its cache_config_info line was cut with "..." inside the braces: malformed, so geometry stays unknown
        ("vllm-docs-design-metrics-partial.txt", "vllm", {"running": 8.0, "block_size": None, "num_blocks": None}),
        ("llamacpp-ik_llama-pr695-comment-partial.txt", "llamacpp", {"waiting": None, "running": None}),
    ],
    ids=["triton", "sglang", "vllm-partial", "llamacpp-partial"],
)
def test_committed_pages_give_their_engine_signals(
    reference_data: Path, file: str, engine: str, expected: dict[str, object]
) -> None:
    got = signals((reference_data / "metrics" / file).read_text(), engine)
    assert {k: got[k] for k in expected} == expected
    if engine != "vllm":
        assert got["max_lora"] is None  # no LoRA series on these engines: unknown, not 0


def test_a_malformed_wanted_line_is_reported_and_the_rest_kept(reference_data: Path) -> None:
    text = (reference_data / "metrics" / "vllm-docs-design-metrics-partial.txt").read_text()
    result = extract(text, BUILTIN_ENGINES["vllm"])
    assert result.sample.running == 8.0
    assert [p.split(" (")[1].split(")")[0] for p in result.problems] == ["vllm:cache_config_info"]


def test_vllm_page_all_signals_and_newest_lora_series() -> None:
    page = vllm_page(waiting=3, running=8, kv_usage=0.5, running_adapters="a,b", waiting_adapters="c", max_lora=2)
    result = extract(page, BUILTIN_ENGINES["vllm"])
    s = result.sample
    assert (s.waiting, s.running, s.kv_usage, s.max_lora, s.block_size, s.num_blocks) == (3, 8, 0.5, 2, 16, 81767)
    # two lora series: the one with the larger value (a timestamp) wins, as upstream
    assert (s.running_adapters, s.waiting_adapters) == (("a", "b"), ("c",))
    assert result.problems == ()


def test_old_vllm_kv_name_is_a_fallback() -> None:
    assert signals("vllm:gpu_cache_usage_perc 0.7\n", "vllm")["kv"] == 0.7
    both = "vllm:gpu_cache_usage_perc 0.7\nvllm:kv_cache_usage_perc 0.2\n"
    assert signals(both, "vllm")["kv"] == 0.2


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ('vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 3\n', 5.0),
        ('vllm:num_requests_waiting{e="0"} 2 1000\nvllm:num_requests_waiting{e="1"} 3 2000\n', 3.0),
    ],
    ids=["data-parallel-ranks-sum", "latest-timestamp-wins"],
)
def test_several_series_for_one_signal(page: str, expected: float) -> None:
    assert signals(page, "vllm")["waiting"] == expected


def test_kv_usage_of_several_ranks_is_the_fullest() -> None:
    page = 'vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:kv_cache_usage_perc{engine="1"} 0.75\n'
    assert signals(page, "vllm")["kv"] == 0.75


def test_duplicate_series_is_a_problem_and_the_last_is_kept() -> None:
    result = extract("vllm:num_requests_waiting 1\nvllm:num_requests_waiting 4\n", BUILTIN_ENGINES["vllm"])
    assert result.sample.waiting == 4.0
    assert any("duplicate series" in p for p in result.problems)


def test_unknown_engine_label_falls_back_to_default_and_aliases_resolve() -> None:
    reg = EngineRegistry()
    assert reg.for_engine("no-such-engine").name == "vllm"
    assert reg.for_engine(None).name == "vllm"
    assert reg.for_engine("llama.cpp").name == "llamacpp"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("m", SeriesSpec("m")),
        ('m{a="b"}', SeriesSpec("m", (("a", "b"),))),
        ("m{a=b, c = d}", SeriesSpec("m", (("a", "b"), ("c", "d")))),
        ('m{a="x\\"y"}', SeriesSpec("m", (("a", 'x"y'),))),
    ],
    ids=["name", "quoted", "bare-values", "escaped"],
)
def test_series_spec_strings(text: str, expected: SeriesSpec) -> None:
    assert SeriesSpec.parse(text) == expected


def test_config_replaces_an_engine_whole_and_adds_new_ones() -> None:
    reg = engines_from_config(
        {
            "defaultEngine": "atom",
            "engineLabelKey": "inference.networking.k8s.io/engine-type",
            "engineConfigs": [
                {"name": "vllm", "queuedRequestsSpec": "vllm:num_requests_waiting", "loraSpec": ""},
                {
                    "name": "atom",
                    "queuedRequestsSpec": "atom:q",
                    "kvUsageSpec": 'atom:kv{kind="gpu"}|atom:kv_old',
                },
            ],
        },
        "epp.yaml",
    )
    assert reg.default == "atom"
    vllm = reg.for_engine("vllm")
    assert vllm.lora == () and vllm.running == ()  # replaced whole: unspecified signals are off
    page = 'atom:q 4\natom:kv{kind="cpu"} 0.9\natom:kv{kind="gpu"} 0.3\n'
    assert signals_with(reg, page, "atom") == (4.0, 0.3)
    assert signals_with(reg, "atom:kv_old 0.6\n", "other") == (None, 0.6)


def signals_with(reg: EngineRegistry, page: str, engine: str) -> tuple[float | None, float | None]:
    s = extract(page, reg.for_engine(engine)).sample
    return nan_to_none(s.waiting), nan_to_none(s.kv_usage)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"bogus": 1}, "unknown field"),
        ({"engineConfigs": {}}, "engineConfigs: must be a list"),
        ({"engineConfigs": [{"queuedRequestsSpec": "x"}]}, "engineConfigs[0].name"),
        ({"engineConfigs": [{"name": "x", "kvUsageSpec": "1bad{"}]}, "engineConfigs[0].kvUsageSpec"),
        ({"engineConfigs": [{"name": "x", "typo": "a"}]}, "unknown field(s) typo"),
        ({"defaultEngine": "nope"}, "defaultEngine"),
    ],
    ids=["unknown-key", "not-a-list", "no-name", "bad-spec", "typo", "unknown-default"],
)
def test_config_errors_name_the_file_and_field(params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        engines_from_config(params, "epp.yaml")
    assert "epp.yaml" in str(err.value)
    assert field in str(err.value)
