"""``python -m prada_jax.traces``: exit codes and messages (no traceback for bad data)."""
import json
import os
import subprocess
import sys
from pathlib import Path


from prada_jax.traces import format as fmt
from prada_jax.traces.__main__ import main

REPO = Path(__file__).resolve().parents[3]


def test_synth_validate_stats(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["synth", "--preset", "gsm8k", "--out", str(out), "--problems", "15",
                 "--seed", "2", "--prm-noise", "0.5", "--prm-miscalibration", "0.3"]) == 0
    meta = fmt.read_meta(out)
    assert meta["generator"]["prm_noise"] == 0.5 and meta["generator"]["seed"] == 2
    assert meta["generator"]["prm_miscalibration"] == 0.3 and meta["counts"]["problems"] == 15
    assert "SYNTHETIC" in capsys.readouterr().out
    assert main(["validate", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
    js = tmp_path / "s.json"
    assert main(["stats", str(out), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert "gsm8k [synthetic]" in printed and "accuracy all-SLM" in printed
    assert json.loads(js.read_text())[0]["problems"] == 15


def test_bad_folder_exit_2_names_field(tmp_path, capsys):
    out = tmp_path / "g"
    main(["synth", "--preset", "mmlu_stem", "--out", str(out), "--problems", "5"])
    m = json.loads((out / fmt.META_FILE).read_text())
    m["format_version"] = 42
    (out / fmt.META_FILE).write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["validate", str(out)]) == 2
    err = capsys.readouterr().err
    assert "format_version" in err and "meta.json" in err and "Traceback" not in err
    assert main(["stats", str(out)]) == 2


def test_bad_setting_exit_2(tmp_path, capsys):
    assert main(["synth", "--preset", "gsm8k", "--out", str(tmp_path / "x"),
                 "--problems", "0"]) == 2
    assert "problems" in capsys.readouterr().err
    assert main(["synth", "--preset", "nope", "--out", str(tmp_path / "y")]) == 2  # absl enum
    assert "--preset" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
    # underscore (absl) names and the older dash spellings are the same flag
    assert main(["synth", "--preset=gsm8k", f"--out={tmp_path / 'z'}", "--problems=3",
                 "--prm_noise=0.5"]) == 0
    assert fmt.read_meta(tmp_path / "z")["generator"]["prm_noise"] == 0.5
    assert main(["synth", "--preset=gsm8k", f"--out={tmp_path / 'w'}", "--bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err and not (tmp_path / "w").exists()


def test_module_entry_point_no_traceback(tmp_path):
    (tmp_path / fmt.META_FILE).write_text("{}")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "prada_jax.traces", "validate", str(tmp_path)],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode == 2
    assert "format_version" in r.stderr and "Traceback" not in r.stderr


def test_build_without_torch_extra_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "prada_jax.traces.builder.cli", None)   # import -> ImportError
    assert main(["build", "--help"]) == 2
    assert "[torch]" in capsys.readouterr().err
