"""host_info.host_cpu: the CPU facts the runtime line prints (docs/reproducibility.md)."""
from prada_jax import host_info

AVX512 = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
          "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw\n\n"
          "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
          "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw\n")
AVX2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2\n"
OLD = "model name\t: Old CPU\nflags\t\t: fpu sse2 sse4_2 avx\n"


def test_names_model_cores_and_the_isa_that_changes_bits():
    assert host_info.host_cpu(AVX512, 64, "") == \
        "Intel(R) Xeon(R) Platinum 8480+, 64 usable core(s), avx512f/avx2/fma"
    assert host_info.host_cpu(AVX2, 2, "") == "AMD EPYC, 2 usable core(s), avx2/fma"
    assert host_info.host_cpu(OLD, 1, "") == "Old CPU, 1 usable core(s), no avx2/fma"


def test_xla_flags_shown_when_set_and_no_flags_list():
    line = host_info.host_cpu(AVX2, 2, " --xla_cpu_max_isa=AVX ")
    assert line.endswith(", XLA_FLAGS=--xla_cpu_max_isa=AVX")
    assert "isa unknown" in host_info.host_cpu("", 4, "")


def test_this_process():
    line = host_info.host_cpu()
    assert "usable core(s)" in line and not line.startswith(",")
    assert f"host {line}" in host_info.runtime_info()
