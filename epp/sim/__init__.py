"""A vLLM-compatible model-server simulator: a pure engine model, served over HTTP, many servers per process."""

from epp.sim.config import ServerConfig
from epp.sim.engine import Engine, Finished, SimRequest, StepOutcome
from epp.sim.pool import SimulatedPool
from epp.sim.profiles import H100_LLAMA_8B, L4_LLAMA_8B, PROFILES, EngineProfile, profile_named
from epp.sim.server import SERVER_HEADER, SimServer

__all__ = [
    "H100_LLAMA_8B",
    "L4_LLAMA_8B",
    "PROFILES",
    "SERVER_HEADER",
    "Engine",
    "EngineProfile",
    "Finished",
    "ServerConfig",
    "SimRequest",
    "SimServer",
    "SimulatedPool",
    "StepOutcome",
    "profile_named",
]
