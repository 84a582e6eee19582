"""Scraped values no model server can mean are refused: the signal turns unknown and the refusal is counted.

Reproduction kept from the hardening probe: an endpoint whose page said `vllm:num_requests_waiting -5` looked like
the shortest queue and drew 40 % of all picks among eight endpoints.
"""

from __future__ import annotations

import math

import pytest

from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.engines import EngineRegistry, extract
from epp.scrape.scraper import ScrapeService
from epp.scrape.validate import BOUNDS, rejection
from tests.scrape.test_scraper import row, serve, servers, service_for, wait_for  # noqa: F401
from tests.scrape.vllm_page import vllm_page

VLLM = EngineRegistry().for_engine("vllm")


@pytest.mark.parametrize(
    ("line", "signal", "reason"),
    [
        ("vllm:num_requests_waiting -5", "waiting", "negative"),
        ("vllm:num_requests_waiting NaN", "waiting", "nan"),
        ("vllm:num_requests_running +Inf", "running", "infinite"),
        ("vllm:num_requests_running 1e300", "running", "too_large"),
        ("vllm:kv_cache_usage_perc 7.5", "kv_usage", "too_large"),
        ("vllm:kv_cache_usage_perc -0.1", "kv_usage", "negative"),
        ('vllm:cache_config_info{block_size="-16",num_gpu_blocks="100"} 1', "block_size", "negative"),
        ('vllm:cache_config_info{block_size="16",num_gpu_blocks="inf"} 1', "num_blocks", "infinite"),
        ('vllm:lora_requests_info{max_lora="-1",running_lora_adapters=""} 1', "max_lora", "negative"),
    ],
)
def test_an_implausible_value_is_unknown_and_says_why(line: str, signal: str, reason: str) -> None:
    """waiting = -5 (reproduction: 40 % of picks) and its relatives: each becomes NaN, not a score."""
    result = extract(line + "\n", VLLM)
    assert math.isnan(getattr(result.sample, signal))
    assert result.rejected == ((signal, reason),)
    assert any(signal in p and reason in p for p in result.problems)
    assert result.signals_found == 1  # the series is there; its value is what was refused


def test_one_bad_rank_makes_the_whole_sum_unknown() -> None:
    """Two data-parallel ranks, 10 and -5: summing would report 5, a queue that looks half as long as it is."""
    page = 'vllm:num_requests_waiting{engine="0"} 10\nvllm:num_requests_waiting{engine="1"} -5\n'
    result = extract(page, VLLM)
    assert math.isnan(result.sample.waiting)
    assert result.rejected == (("waiting", "negative"),)


def test_plausible_values_and_the_bounds_themselves_pass() -> None:
    page = vllm_page(waiting=0, running=1_000_000, kv_usage=1.0)
    result = extract(page, VLLM)
    assert (result.sample.waiting, result.sample.running, result.sample.kv_usage) == (0.0, 1e6, 1.0)
    assert result.rejected == ()
    for signal, (low, high) in BOUNDS.items():
        assert rejection(signal, low) is None and rejection(signal, high) is None


async def test_the_scraper_counts_refused_values_by_signal_and_reason(servers, service_for) -> None:  # noqa: F811
    """The endpoint that reported waiting = -5 is known to be wrong, not ranked first."""
    bad = await serve(servers, b"vllm:num_requests_waiting -5\nvllm:num_requests_running 2\n")
    table = EndpointTable()
    table.upsert(EndpointInfo(bad.address))
    svc: ScrapeService = service_for(table)
    await svc.start()
    await wait_for(lambda: svc.rejected_values.get(("waiting", "negative"), 0) >= 2)
    assert math.isnan(row(table, bad.address)["waiting"])  # type: ignore[arg-type]
    assert row(table, bad.address)["running"] == 2.0
    assert "waiting: refused negative value -5.0" in (svc.status()[bad.address].last_error or "")
