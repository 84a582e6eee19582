"""What `epp demo` runs: sized so round robin visibly suffers on the small GPU yet every phase drains in seconds.

Defaults: three H100-class servers and one L4-class (about a fifth of the prefill speed and a twelfth of the KV
cache), 16 customers with 2k-token contexts, 8 requests/s per listener for 15 s each. Round robin sends a quarter
of the traffic to the L4 whatever its queue; a picker that reads load and prefix affinity need not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DemoConfig:
    seconds: float = 30.0  # traffic in all, split evenly between the two listeners
    rate: float = 8.0  # requests per second offered to each listener
    profiles: tuple[str, ...] = ("h100", "h100", "h100", "l4")
    groups: int = 16
    context_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 64
    speed: float = 1.0
    drain_s: float = 30.0
    seed: int = 0
    workdir: Path | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0 or not self.rate > 0 or not self.speed > 0 or self.drain_s < 0:
            raise ValueError("seconds, rate and speed must be positive, drain_s not negative")
        if not self.profiles:
            raise ValueError("at least one server profile is needed")

    @property
    def phase_s(self) -> float:
        return self.seconds / 2

    @property
    def requests(self) -> int:
        return max(1, round(self.phase_s * self.rate))
