"""The quality benchmark's parts on a tiny pool: trace formats, synthetic text sharing, every policy completes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.quality import main, policy_factory
from benchmarks.virtual_time import capacity, simulate
from benchmarks.workloads import TRACES, UNIT_TOKENS, Item, load_trace, prompt_text, scaled_arrivals, shared_prefix
from epp.scheduling.prefix import PrefixCacheScorer
from epp.sim.profiles import H100_LLAMA_8B


def test_azure_csv_and_mooncake_jsonl_are_read(tmp_path: Path) -> None:
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.1805900,9,1\n"
    )
    moon = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}]
    rows.append({"timestamp": 250, "input_length": 600, "output_length": 2, "hash_ids": [0, 9]})
    moon.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_trace(azure) == [Item(0.0, 374, 44), Item(0.5, 9, 1)]
    assert load_trace(moon) == [Item(0.0, 1100, 5, (0, 1)), Item(0.25, 600, 2, (0,))]  # full 512-token units only


def test_a_file_in_neither_format_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="neither Azure CSV"):
        load_trace(bad)


def test_prompt_text_shares_exactly_the_shared_units() -> None:
    a, b = Item(0, 2 * UNIT_TOKENS + 10, 1, (7, 8)), Item(0, 2 * UNIT_TOKENS + 10, 1, (7, 9))
    ta, tb = prompt_text(1, a), prompt_text(2, b)
    assert len(ta) == (2 * UNIT_TOKENS + 10) * 4
    unit_chars = UNIT_TOKENS * 4
    assert ta[:unit_chars] == tb[:unit_chars] and ta[unit_chars : 2 * unit_chars] != tb[unit_chars : 2 * unit_chars]


def test_arrivals_are_scaled_to_the_requested_rate() -> None:
    items = shared_prefix(1000, seed=3)
    t = scaled_arrivals(items, rate=50.0)
    assert t[0] == 0 and (len(t) - 1) / t[-1] == pytest.approx(50.0)


@pytest.mark.parametrize("policy", ["rr", "random", "least-queue", "upstream", "epp", "precise", "oracle"])
def test_every_policy_completes_every_request(policy: str) -> None:
    items = shared_prefix(300, groups=8, prefix_tokens=2048, question_tokens=64, output_tokens=16, seed=1)
    pool = [H100_LLAMA_8B] * 2
    rate = 0.8 * 2 * capacity(items, H100_LLAMA_8B, sample=100)
    result = simulate(items, scaled_arrivals(items, rate), pool, policy_factory(policy, 2, 0, None))
    assert not np.isnan(result.ttft).any() and (result.server >= 0).all()
    assert (result.ttft <= result.e2e).all()


def test_the_oracle_finds_cached_prefixes_round_robin_does_not() -> None:
    items = shared_prefix(400, groups=40, prefix_tokens=4096, question_tokens=64, output_tokens=16, seed=2)
    small = dataclasses.replace(H100_LLAMA_8B, num_blocks=4096)  # 64k tokens: a quarter of the groups fit
    pool = [small] * 4
    arrivals = scaled_arrivals(items, 20.0)
    rr = simulate(items, arrivals, pool, policy_factory("rr", 4, 0, None))
    oracle = simulate(items, arrivals, pool, policy_factory("oracle", 4, 0, None))
    assert oracle.hit_tokens > 1.5 * rr.hit_tokens


def test_the_precise_policy_matches_from_the_engines_events() -> None:
    """`precise`: the engines' KV events reach its index after the delay and decide the match, no fallback."""
    items = shared_prefix(200, groups=4, prefix_tokens=2048, question_tokens=64, output_tokens=16, seed=3)
    pool = [H100_LLAMA_8B] * 2
    made: list[object] = []

    def factory(engines: object, clock: object) -> object:
        made.append(policy_factory("precise", 2, 0, None, 0.05)(engines, clock))  # type: ignore[arg-type]
        return made[-1]

    simulate(items, scaled_arrivals(items, 10.0), pool, factory)
    picker = made[0]
    assert picker.index.total_blocks() > 0  # type: ignore[attr-defined]
    # until a server's first events arrive it is absent (approximate match); after that, every pick is precise
    assert picker.producer.precise_picks >= 100  # type: ignore[attr-defined]
    assert picker.producer.fallbacks["no_tokens"] == picker.producer.fallbacks["stale"] == 0  # type: ignore[attr-defined]


def test_the_command_writes_json_markdown_and_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.json"
    md = tmp_path / "q.md"
    argv = ["--workload", "shared-prefix", "--load", "0.5", "--requests", "200", "--endpoints", "2"]
    assert main([*argv, "--policies", "rr,epp", "--json", str(out), "--markdown", str(md)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["rr", "epp"]
    assert "shared-prefix 80%: epp p90 TTFT ≤ 1.5 × oracle: n/a" in md.read_text()


@pytest.mark.parametrize(
    "name",
    [
        "AzureLLMInferenceTrace_conv.csv",
        "AzureLLMInferenceTrace_code.csv",
        "mooncake-synthetic_trace.jsonl",
        "mooncake-arxiv_trace.jsonl",
        "mooncake-conversation_trace.jsonl",
    ],
    ids=["azure-conv", "azure-code", "mooncake", "mooncake-arxiv", "mooncake-conversation"],
)
def test_the_reference_traces_load(name: str) -> None:
    items = load_trace(TRACES / name, 200)
    assert len(items) == 200
    assert all(i.prompt_tokens >= 1 and i.output_tokens >= 1 for i in items)
    assert [i.arrival for i in items] == sorted(i.arrival for i in items)
    if name.startswith("mooncake"):
        firsts = [i.units[0] for i in items if i.units]
        assert len(set(firsts)) < len(firsts)  # real prefix sharing: several requests start with the same block


def test_the_conversation_slice_resends_earlier_turns_as_prefixes() -> None:
    """Mooncake's conversation trace (its first 268 requests): every prompt starts with the shared block 0, and
    later turns of a conversation resend an earlier turn's blocks (multi-turn reuse, more than one block deep)."""
    items = load_trace(TRACES / "mooncake-conversation_trace.jsonl")
    assert len(items) == 268
    assert all(i.units[:1] == (0,) for i in items if i.units)
    seen: set[tuple[int, ...]] = set()
    resent = 0
    for item in items:
        if len(item.units) > 2 and item.units[:2] in seen:
            resent += 1
        seen.update(item.units[:k] for k in range(2, len(item.units) + 1))
    assert resent >= 10


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--trace", "/nonexistent/trace.csv"], "No such file"),
        (["--policies", "rr,magic"], "unknown policy 'magic'"),
        (["--profiles", "a100"], "unknown profile"),
    ],
    ids=["unknown-workload", "missing-trace", "unknown-policy", "unknown-profile"],
)
def test_bad_arguments_end_with_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--requests", "50", "--endpoints", "2"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_config_profile_listed_in_policies_runs_once(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    config = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "upstream-default.yaml"
    argv = ["--workload", "shared-prefix", "--load", "0.5", "--requests", "100", "--endpoints", "2"]
    assert main([*argv, "--policies", "rr,epp:upstream-default", "--config", str(config), "--json", str(out)]) == 0
    assert [r["policy"] for r in json.loads(out.read_text())["rows"]] == ["rr", "epp:upstream-default"]


def test_several_config_files_each_run_as_their_own_policy() -> None:
    from benchmarks.quality import _configs, parse_args

    args = parse_args(["--config", "benchmarks/configs/upstream-default.yaml", "--config", "x/upstream-current.yaml"])
    assert list(_configs(args)) == ["upstream-default", "upstream-current"]


def test_upstreams_current_default_profile_file_loads() -> None:
    from epp.app.config_file import load_config
    from epp.scheduling import build_scheduler

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "upstream-current.yaml"
    profile = build_scheduler(load_config(path)).handler.profile
    # the token-producer the approximate producer consumes is auto-created, as upstream's (the estimate backend)
    assert [type(p).__name__ for p in profile.producers] == ["TokenProducer", "ApproxPrefixCacheProducer"]
    assert [(s.scorer.type_name, s.weight) for s in profile.scorers] == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]


def test_split_names_carry_replicas_workers_and_the_pick_logs_delay() -> None:
    from benchmarks.quality import split_of

    assert split_of("epp") == ("epp", 1, 1, None)
    assert split_of("epp:epp-config@r2w1") == ("epp:epp-config", 2, 1, None)
    assert split_of("epp@r1w4log50") == ("epp", 1, 4, 0.05)


def test_a_shared_pick_log_teaches_every_worker_the_others_picks() -> None:
    """Workers with their own prefix index learn only their own picks; fed by the shared log, each index holds
    what the other worker sent as well, `delay` after it was sent."""
    items = shared_prefix(200, groups=8, prefix_tokens=2048, question_tokens=64, output_tokens=16, seed=4)
    pool = [H100_LLAMA_8B] * 4
    made: dict[str, object] = {}

    def factory(name: str) -> object:
        def build(engines: object, clock: object) -> object:
            made[name] = policy_factory(name, 4, 0, None)(engines, clock)  # type: ignore[arg-type]
            return made[name]

        return build

    arrivals = scaled_arrivals(items, 10.0)
    for name in ("epp@r1w2", "epp@r1w2log1"):
        simulate(items, arrivals, pool, factory(name))

    def indexes(name: str) -> list[set[int]]:
        split = made[name]
        for log in split._logs:  # type: ignore[attr-defined]
            log.deliver(float("inf"))  # the last picks' records, due after the run ended
        schedulers = [d._scheduler for d in split.directors[0]]  # type: ignore[attr-defined]
        scorers = [s.scorer for sched in schedulers for s in sched.profile.scorers]
        return [set(s.index._holders) for s in scorers if isinstance(s, PrefixCacheScorer)]

    own, shared = indexes("epp@r1w2"), indexes("epp@r1w2log1")
    assert own[0] and own[1] and own[0] != own[1]  # each learned only its own picks
    assert shared[0] and shared[0] == shared[1]  # both learned every pick (nothing evicted on this small run)


def test_phases_run_each_row_at_several_scrape_phases(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    argv = ["--workload", "shared-prefix", "--load", "0.5", "--requests", "100", "--endpoints", "2"]
    assert main([*argv, "--policies", "epp", "--phases", "3", "--json", str(out)]) == 0
    assert "p90 TTFT ms by scrape phase:" in capsys.readouterr().out
    assert [r["policy"] for r in json.loads(out.read_text())["rows"]] == ["epp"]
    assert main([*argv, "--phases", "0"]) == 2
