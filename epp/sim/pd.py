"""P/D on a simulated server: the steps llm-d's routing sidecar takes for a decode pod (pkg/sidecar/proxy, the
NIXL v2 connector), so that a picker's prefill/decode pairs are tested against real HTTP legs."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout

from epp.sim.config import ServerConfig
from epp.sim.openai import prompt_units

log = logging.getLogger(__name__)

PREFILLER_HEADER = "x-prefiller-host-port"  # set by the picker: where the decode pod's sidecar runs the prefill
PREFILL_TIMEOUT_S = 30.0


@dataclass(slots=True)
class PdCounters:
    """What the P/D tests read back (`GET /sim/pd`): prefill legs this server answered as a prefiller; prefill legs
    it sent as a decode server's sidecar, how many failed (then it prefilled itself) and how many it decoded with
    KV pulled from the prefiller."""

    prefills_served: int = 0
    prefill_requests: int = 0
    prefill_failures: int = 0
    remote_decodes: int = 0


class PdSidecar:
    """A server's prefill legs to other servers and the KV transfer they stand for; `port` is read when needed
    (a server bound to port 0 learns its port at start)."""

    def __init__(self, config: ServerConfig, port: Callable[[], int]) -> None:
        self._config = config
        self._port = port
        self.counters = PdCounters()
        self._client: ClientSession | None = None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def transfer_s(self, prompt: str) -> float:
        tokens = prompt_units(prompt, self._config.profile.block_size)[0]
        return tokens * self._config.profile.kv_transfer_s_per_token / self._config.speed

    def kv_params(self, prompt_tokens: int) -> dict[str, Any]:
        """What a prefill server hands back for the decode leg: where to pull the KV blocks from."""
        blocks = -(-prompt_tokens // self._config.profile.block_size)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self._config.name,
            "remote_block_ids": list(range(blocks)),
            "remote_host": self._config.host,
            "remote_port": self._port(),
            "tp_size": 1,
        }

    async def remote_prefill(self, path: str, body: dict[str, Any], prefiller: str) -> bool:
        """The prefill leg: the client's request to the prefiller with `kv_transfer_params` asking for a remote
        decode and a single token, as the sidecar sends it. True when the prefiller answered with the params the
        decode leg needs; False (counted) when it could not be reached or failed: this server then prefills the
        prompt itself, so the request is still served."""
        leg = {k: v for k, v in body.items() if k not in ("stream_options", "max_completion_tokens")}
        leg.update(stream=False, max_tokens=1)
        leg["kv_transfer_params"] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        if self._client is None:
            self._client = ClientSession(timeout=ClientTimeout(total=PREFILL_TIMEOUT_S))
        self.counters.prefill_requests += 1
        try:
            async with self._client.post(f"http://{prefiller}{path}", json=leg) as response:
                answer = await response.json(content_type=None) if response.status == 200 else None
        except (ClientError, OSError, TimeoutError, json.JSONDecodeError, ValueError):
            answer = None
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
            self.counters.prefill_failures += 1
            log.debug("prefill on %s failed; prefilling locally", prefiller)
            return False
        self.counters.remote_decodes += 1
        return True
