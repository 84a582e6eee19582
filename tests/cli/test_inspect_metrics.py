"""`epp inspect-metrics` on files and on a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from epp.cli import main
from tests.scrape.fake_server import FakeMetricsServer
from tests.scrape.vllm_page import vllm_page

KEYS = {
    "waiting",
    "running",
    "kv_cache_usage",
    "running_lora_adapters",
    "waiting_lora_adapters",
    "max_lora",
    "block_size",
    "num_blocks",
}


def test_prints_the_signals_of_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "metrics.txt"
    page.write_text(vllm_page(waiting=2, running=1, kv_usage=0.5, running_adapters="x", waiting_adapters=""))
    assert main(["inspect-metrics", str(page)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= KEYS
    assert (out["waiting"], out["running"], out["kv_cache_usage"]) == (2.0, 1.0, 0.5)
    assert (out["running_lora_adapters"], out["waiting_lora_adapters"]) == (["x"], [])
    assert (out["max_lora"], out["block_size"], out["num_blocks"]) == (4.0, 16.0, 81767.0)


def test_null_where_the_page_does_not_say(reference_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = reference_data / "metrics" / "sglang-docs-production_metrics.txt"
    assert main(["inspect-metrics", "--engine", "sglang", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_cache_usage"] == 0.28
    assert out["running_lora_adapters"] is None and out["max_lora"] is None


@pytest.mark.process
def test_reads_an_http_url() -> None:
    async def scenario() -> str:
        server = await FakeMetricsServer(page=vllm_page(waiting=7).encode()).start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "epp",
                "inspect-metrics",
                f"http://{server.address}/metrics",
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0
            return out.decode()
        finally:
            await server.stop()

    assert json.loads(asyncio.run(scenario()))["waiting"] == 7.0


@pytest.mark.parametrize(
    "source",
    ["/no/such/file", "http://127.0.0.1:1/metrics", "https://127.0.0.1/metrics"],
    ids=["missing-file", "refused", "https"],
)
def test_unreadable_source_exits_1_with_one_line(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-metrics", source]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and source in err
