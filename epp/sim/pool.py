"""Many simulated servers in one process, each on its own port: what `epp sim` runs and what tests start.

    async with SimulatedPool(servers=4, base_port=0) as pool:
        pool.addresses  # ["127.0.0.1:41234", ...]

`base_port=0` lets the OS choose free ports (tests); otherwise server i listens on base_port + i. Profiles are
cycled over the servers, so `profiles=(H100, H100, L4)` makes a heterogeneous pool. With `kv_events_port`, server i
publishes vLLM-format KV events on kv_events_port + i (`epp.sim.kvevents`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.profiles import H100_LLAMA_8B, EngineProfile
from epp.sim.server import SimServer


class SimulatedPool:
    def __init__(
        self,
        servers: int = 8,
        base_port: int = 8100,
        host: str = "127.0.0.1",
        profiles: Sequence[EngineProfile] = (H100_LLAMA_8B,),
        engine: str = "vllm",
        model: str = DEFAULT_MODEL,
        lora_adapters: Sequence[str] = (),
        speed: float = 1.0,
        kv_events_port: int | None = None,
        kv_events_replay_port: int | None = None,
        kv_events_hash: str = "int",
        roles: Sequence[str] = ("both",),
    ) -> None:
        if servers <= 0:
            raise ValueError("servers must be positive")
        if not profiles:
            raise ValueError("at least one profile is needed")
        if base_port and base_port + servers - 1 > 65535:
            raise ValueError(f"ports {base_port}..{base_port + servers - 1} exceed 65535")

        def offset(base: int | None, i: int) -> int | None:
            # KV-event ports: server i publishes on base + i, as its HTTP port; 0 lets the OS choose
            return None if base is None else base + i if base else 0

        self.servers = [
            SimServer(
                ServerConfig(
                    name=f"sim-{i}",
                    host=host,
                    port=base_port + i if base_port else 0,
                    profile=profiles[i % len(profiles)],
                    engine=engine,
                    model=model,
                    lora_adapters=tuple(lora_adapters),
                    speed=speed,
                    kv_events_port=offset(kv_events_port, i),
                    kv_events_replay_port=offset(kv_events_replay_port, i),
                    kv_events_hash=kv_events_hash,
                    role=roles[i % len(roles)] if roles else "both",
                )
            )
            for i in range(servers)
        ]

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    async def start(self) -> None:
        started: list[SimServer] = []
        try:
            for server in self.servers:
                await server.start()
                started.append(server)
        except BaseException:
            for server in started:
                await server.stop()
            raise

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()

    async def __aenter__(self) -> SimulatedPool:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
