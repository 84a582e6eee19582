"""One simulated server's settings: its engine profile and metric names, its model and adapters, its speed, its
KV-events sockets and its P/D role."""

from __future__ import annotations

from dataclasses import dataclass

from epp.sim.metrics import ENGINES
from epp.sim.profiles import H100_LLAMA_8B, EngineProfile

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROLE_LABEL = "llm-d.ai/role"
ROLES = ("prefill", "decode", "both")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (read it back from `SimServer.port`)
    profile: EngineProfile = H100_LLAMA_8B
    engine: str = "vllm"
    model: str = DEFAULT_MODEL
    lora_adapters: tuple[str, ...] = ()
    speed: float = 1.0  # simulated seconds per wall-clock second (2.0: everything twice as fast)
    # KV-cache events over ZMQ, as vLLM's --kv-events-config: None = off, 0 = any free port (read back from
    # `SimServer.kv_events_port`); the replay socket likewise; block hashes as int64 ("int") or 32 bytes ("bytes").
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_events_hash: str = "int"
    # P/D role, as llm-d labels pods (`llm-d.ai/role`): a decode (or both) server runs the routing sidecar's steps
    # for requests that name a prefiller in `x-prefiller-host-port`; every server answers a prefill leg.
    role: str = "both"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; choose from {', '.join(ROLES)}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose from {', '.join(ENGINES)}")
        if not self.speed > 0:
            raise ValueError("speed must be positive")
