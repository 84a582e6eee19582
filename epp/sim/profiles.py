"""Performance profiles of simulated model servers: one GPU + model pairing each, every number cited.

The reference profile is Llama-3.1-8B-Instruct in bf16 on one H100-80GB (SXM) under vLLM; the small profile is the
same model on an NVIDIA L4 (24 GB), so a pool can be heterogeneous. docs/simulator.md derives every number below;
the short form is next to each field. A profile is a value: the benchmark and the HTTP simulator read the same ones,
so no result can come from a simulator tuned for one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Llama-3.1-8B: 32 layers × 8 KV heads × head dim 128 × (K and V) × 2 bytes (bf16) = 131,072 B = 128 KiB per token.
KV_BYTES_PER_TOKEN_LLAMA_8B = 32 * 8 * 128 * 2 * 2


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What one simulated server can do. Times in seconds; sizes in tokens or KV blocks."""

    name: str
    num_blocks: int  # KV-cache blocks on the GPU
    block_size: int  # tokens per KV block
    max_num_seqs: int  # sequences in one continuous batch
    max_batched_tokens: int  # token budget of one engine step (decode tokens + prefill chunks)
    prefill_s_per_token: float  # compute time per uncached prompt token
    step_base_s: float  # fixed cost of one engine step (weights read once + launch overhead)
    step_per_seq_s: float  # per sequence in the batch (sampling, scheduling, detokenising)
    kv_read_s_per_token: float  # per context token attended in a decode step (KV read from HBM)
    max_loras: int = 4  # LoRA adapters resident at once (vLLM --max-loras)
    lora_load_s: float = 0.02  # cost of bringing an adapter into a slot
    # P/D: pulling one prompt token's KV from a prefill server (NIXL over RDMA). 128 KiB per token (Llama-3.1-8B)
    # over a 400 Gb/s NIC at ~50 GB/s ≈ 2.6 µs; an 8k-token prompt then costs ~21 ms before its decode starts.
    kv_transfer_s_per_token: float = KV_BYTES_PER_TOKEN_LLAMA_8B / 50e9

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def __post_init__(self) -> None:
        if self.num_blocks <= 0 or self.block_size <= 0 or self.max_num_seqs <= 0 or self.max_batched_tokens <= 0:
            raise ValueError(f"profile {self.name!r}: sizes must be positive")
        times = (self.prefill_s_per_token, self.step_base_s, self.step_per_seq_s, self.kv_read_s_per_token)
        if min(*times, self.kv_transfer_s_per_token) < 0:
            raise ValueError(f"profile {self.name!r}: times must not be negative")


def _kv_blocks(kv_bytes: float, block_size: int) -> int:
    return int(kv_bytes // (KV_BYTES_PER_TOKEN_LLAMA_8B * block_size))


# H100-80GB SXM: 80 GB × 0.9 (vLLM gpu_memory_utilization) = 72 GB; minus 16 GB weights and ~0.5 GB activations
# and CUDA graphs → ≈ 56 GB of KV ≈ 427k tokens ("≈ 440k" in the issue; we take 56 GiB = 458k tokens → 28,672
# blocks of 16, i.e. 440-460k either way). Prefill: 989 TFLOPS bf16 dense × ~33 % MFU / 16 GFLOP per token
# ≈ 20k tokens/s. Decode: 16 GB weights / 3.35 TB/s HBM3 = 4.8 ms, + launch/sampling ≈ 6 ms per step.
# KV read: 128 KiB / 3.35 TB/s = 39 ns per context token per step.
H100_LLAMA_8B = EngineProfile(
    name="h100-llama3.1-8b",
    num_blocks=_kv_blocks(56 * 2**30, 16),
    block_size=16,
    max_num_seqs=256,
    max_batched_tokens=8192,
    prefill_s_per_token=1 / 20_000,
    step_base_s=0.006,
    step_per_seq_s=30e-6,
    kv_read_s_per_token=KV_BYTES_PER_TOKEN_LLAMA_8B / 3.35e12,
)

# L4 (24 GB GDDR6, 300 GB/s, 121 TFLOPS bf16 dense): 24 × 0.9 = 21.6 GB − 16 GB weights − ~1.1 GB → ~4.5 GB of KV
# ≈ 34k tokens. Prefill: 121 TFLOPS × ~33 % / 16 GFLOP ≈ 2.5k tokens/s. Decode: 16 GB / 300 GB/s = 53 ms
# + ~2 ms ≈ 55 ms per step. KV read: 128 KiB / 300 GB/s = 437 ns per context token. Budget 2048 tokens: vLLM's
# default for the OpenAI server on GPUs under 70 GiB.
L4_LLAMA_8B = EngineProfile(
    name="l4-llama3.1-8b",
    num_blocks=_kv_blocks(4.5 * 2**30, 16),
    block_size=16,
    max_num_seqs=256,
    max_batched_tokens=2048,
    prefill_s_per_token=1 / 2_500,
    step_base_s=0.055,
    step_per_seq_s=30e-6,
    kv_read_s_per_token=KV_BYTES_PER_TOKEN_LLAMA_8B / 300e9,
)

PROFILES: dict[str, EngineProfile] = {"h100": H100_LLAMA_8B, "l4": L4_LLAMA_8B}
MAX_NUM_SEQS_RANGE = (1, 4096)  # what `<profile>-s<N>` accepts


def with_max_num_seqs(profile: EngineProfile, max_num_seqs: int) -> EngineProfile:
    """The same GPU and model served with another `--max-num-seqs` (vLLM's batch cap: 256 by default, deployments
    run 32 to 600 and more). Only the cap changes; where the KV cache holds fewer sequences, it binds first."""
    low, high = MAX_NUM_SEQS_RANGE
    if not low <= max_num_seqs <= high:
        raise ValueError(f"max-num-seqs {max_num_seqs}: expected {low}..{high}")
    return replace(profile, name=f"{profile.name}-s{max_num_seqs}", max_num_seqs=max_num_seqs)


def profile_named(name: str) -> EngineProfile:
    """A built-in profile by short name (h100, l4), optionally with another batch cap: `h100-s600`, `l4-s32`
    (`with_max_num_seqs`); ValueError naming the choices otherwise."""
    base, sep, seqs = name.rpartition("-s")
    if sep and base in PROFILES and seqs.isdigit():
        return with_max_num_seqs(PROFILES[base], int(seqs))
    try:
        return PROFILES[name]
    except KeyError:
        choices = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {name!r}; choose from {choices} (or <profile>-s<max-num-seqs>)") from None
