"""Every named hardware profile's figures pinned against a hand-written table with the source
of each (issue 43): the JAX env and the NumPy reference read the same profile, so a wrong
figure there (η_mem applied twice in the Orin's bandwidth, a datasheet number mistyped) passes
every equivalence test; only a table written from the sources catches it.

The figures are the vendors' (docs/latency.md, "The profiles"); the utilisations η = 0.5 and
η_mem = 0.8 are the project's stated assumptions, not measurements. A new profile or pair
needs its row here.
"""
import pytest

from prada_jax import latency as lat

INT4 = 4.5 / 8.0   # 4-bit weights + one fp16 scale per 32 weights (llama.cpp Q4_0): 18 B / 32

# name: (peak FLOP/s, memory bandwidth B/s, memory B, bytes per weight, bytes per KV element,
#        source)
PROFILES = {
    "a100_80gb_bf16": (312e12, 2039e9, 80e9, 2.0, 2.0,
                       "NVIDIA A100 datasheet (2021): 312 TFLOP/s bf16 dense Tensor Core, "
                       "2,039 GB/s HBM2e, 80 GB (SXM)"),
    "h100_sxm_bf16": (989e12, 3.35e12, 80e9, 2.0, 2.0,
                      "NVIDIA H100 datasheet: 989 TFLOP/s bf16 dense Tensor Core (SXM), "
                      "3.35 TB/s HBM3, 80 GB"),
    "orin_agx_64gb_bf16": (42.5e12, 204.8e9, 64e9, 2.0, 2.0,
                           "Jetson AGX Orin series technical brief: 204.8 GB/s LPDDR5, 64 GB; "
                           "GPU 170 sparse INT8 TOPS -> fp16 dense 170/2/2 = 42.5 TFLOP/s"),
    "orin_agx_64gb_int4": (42.5e12, 204.8e9, 64e9, INT4, 2.0,
                           "the same device with W4A16 weights (fp16 matmuls, fp16 KV cache)"),
    "orin_nano_super_int4": (16.75e12, 102e9, 8e9, INT4, 2.0,
                             "Jetson Orin Nano Super datasheet (Dec 2024): 102 GB/s LPDDR5, "
                             "8 GB, 67 sparse INT8 TOPS -> fp16 dense 67/4 = 16.75 TFLOP/s"),
    "snapdragon_8g3_int4": (45e12, 76.8e9, 16e9, INT4, 2.0,
                            "Snapdragon 8 Gen 3 product brief: LPDDR5X 4800 MHz x 64 bit = "
                            "76.8 GB/s; 45 INT8 TOPS (widely reported, assumed); 16 GB assumed"),
}
ETA, ETA_MEM = 0.5, 0.8   # assumed utilisations, the same for every profile

# pair: (edge profile, server profile); paper has none (the FLOP-only clock)
PAIRS = {"paper": None,
         "a100_orin_bf16": ("orin_agx_64gb_bf16", "a100_80gb_bf16"),
         "a100_orin_int4": ("orin_agx_64gb_int4", "a100_80gb_bf16"),
         "a100_phone_int4": ("snapdragon_8g3_int4", "a100_80gb_bf16"),
         "h100_orin_int4": ("orin_agx_64gb_int4", "h100_sxm_bf16")}


def test_the_tables_name_every_profile_and_pair():
    assert set(lat.PROFILES) == set(PROFILES), "a profile without a pinned row (or a stale row)"
    assert set(lat.PAIRS) == set(PAIRS)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_figures_match_their_sources(name):
    peak, bw, mem, wb, kvb, source = PROFILES[name]
    hw = lat.PROFILES[name]()
    got = {f: float(getattr(hw, f)) for f in lat.HardwareProfile.__dataclass_fields__}
    want = {"peak_flops": peak, "mem_bw": bw, "mem_bytes": mem, "eta": ETA, "eta_mem": ETA_MEM,
            "weight_bytes": wb, "kv_bytes": kvb}
    # float32 leaves: each figure to float32's precision
    assert got == pytest.approx(want, rel=1e-7), f"{name} differs from its source: {source}"


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_pairs_name_the_pinned_profiles(pair):
    profiles = lat.pair_profiles(pair)
    if PAIRS[pair] is None:
        assert profiles is None
        return
    for hw, name in zip(profiles, PAIRS[pair]):
        assert hw == lat.PROFILES[name](), (pair, name)
