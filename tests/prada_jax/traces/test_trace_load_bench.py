"""benchmarks/trace_load.py runs and prints medians (tiny repeat count)."""
from benchmarks.trace_load import main


def test_trace_load_benchmark_prints_medians(tmp_path, capsys):
    assert main(["--preset", "gaokao2023en", "--repeats", "2", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC gaokao2023en" in out and out.count("median") == 3
