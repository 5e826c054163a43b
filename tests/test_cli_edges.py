"""Command-line edges of the error contract (README, "Errors and exit codes") that the sweep in
tests/test_cli_errors.py does not reach: a resume with no intact checkpoint is refused before
the run folder is touched; orbax's complaint about a garbage ``_CHECKPOINT_METADATA`` is not
shown at the default verbosity (the project's own line names the file); float config values
that do not fit float32 are refused up front; symlinked and unknown-key trace folders are
reported by ``validate``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax import checkpointing, errors, run_state

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
                TRANSFORMERS_OFFLINE="1")


def _save_steps(directory: Path, steps=(1, 2)) -> None:
    ck = checkpointing.Checkpointer(directory, max_to_keep=10)
    for s in steps:
        ck.save(s, {"x": jnp.float32(s)}, meta={"step": s}, force=True)
    ck.close()


def _garbage_metadata(directory: Path, step: int) -> Path:
    path = directory / str(step) / "_CHECKPOINT_METADATA"
    path.write_text("garbage{")
    return path


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


# ----------------------------------------------------------------------------- refused resume

def test_check_resume_refuses_a_run_without_an_intact_checkpoint(tmp_path):
    """Every step damaged → ``check_resume`` raises one line naming the folder, the steps and the
    newest damaged file, and touches nothing; one intact step (or none at all, or an intact
    step without a manifest) passes."""
    config = {"seed": 0, "lr": 1e-3}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ck_dir = tmp_path / "checkpoints"
    _save_steps(ck_dir)
    bad = _garbage_metadata(ck_dir, 2)
    assert not run_state.check_resume(config, tmp_path, ()).fresh        # step 1 intact
    # (every data file: orbax leaves some a step no longer references, whose damage only the
    # manifest's hash can see; the read back of a manifest-less step below sees the rest)
    for p in [p for p in (ck_dir / "1" / "state").rglob("*") if p.parent.name == "d"]:
        p.write_bytes(p.read_bytes()[:3])
    before = _tree(tmp_path)
    with pytest.raises(checkpointing.DamagedCheckpoint) as e:
        run_state.check_resume(config, tmp_path, ())
    msg = str(e.value)
    assert isinstance(e.value, errors.BadInput) and "\n" not in msg
    assert msg.startswith(f"no intact checkpoint to resume from in {ck_dir} (damaged: steps 1, 2)")
    assert str(bad) in msg
    assert _tree(tmp_path) == before
    # the same refusal from the restore path (no warning lines before it)
    with pytest.raises(checkpointing.DamagedCheckpoint, match="no intact checkpoint"):
        checkpointing.Checkpointer(ck_dir).restore_latest({"x": jnp.float32(0)})
    # a step without a manifest is read back in full: step 1's truncated file is still found,
    # while an intact step without a manifest passes
    (ck_dir / "1" / checkpointing.MANIFEST_FILE).unlink()
    with pytest.raises(checkpointing.DamagedCheckpoint, match=r"\(damaged: steps 1, 2\)"):
        run_state.check_resume(config, tmp_path, ())
    _save_steps(tmp_path / "other" / "checkpoints", (1,))
    (tmp_path / "other" / "checkpoints" / "1" / checkpointing.MANIFEST_FILE).unlink()
    assert run_state.check_resume(config, tmp_path / "other", ()).fresh
    # a fresh run (no checkpoints folder) and skipping the check
    assert run_state.check_resume(config, tmp_path / "new", ()).fresh
    (ck_dir / "1").rename(ck_dir / "1.damaged")
    run_state.check_resume(config, tmp_path, (), checkpoints=None)
    with pytest.raises(checkpointing.DamagedCheckpoint, match=r"\(damaged: step 2\)"):
        run_state.check_resume(config, tmp_path, ())


# ----------------------------------------------------------------------------- one stderr line

_RESUME = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from prada_jax import checkpointing, cli, runloop

    def main(argv):
        ck = checkpointing.Checkpointer(argv[1])
        state, meta, step = runloop.restore_or_init(ck, {"x": jnp.float32(0)})
        ck.close()
        print("resumed", step, float(state["x"]))

    cli.run(main)
""")


def _resume(directory: Path, *flags: str) -> subprocess.CompletedProcess:
    """The ``_RESUME`` command in a subprocess (``python -c``)."""
    return subprocess.run([sys.executable, "-c", _RESUME, *flags, str(directory)], env=_env(),
                          capture_output=True, text=True, timeout=300)


def _resume_here(run_command, module_dir: Path, directory: Path,
                 *flags: str) -> subprocess.CompletedProcess:
    """The same command in this process (the conftest's ``run_command``), as module
    ``_resume_cmd`` written under ``module_dir``."""
    (module_dir / "_resume_cmd.py").write_text(_RESUME)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(module_dir))
        mp.delitem(sys.modules, "_resume_cmd", raising=False)
        code, out, err = run_command("_resume_cmd", *flags, str(directory))
    return subprocess.CompletedProcess([], code, out, err)


def test_garbage_checkpoint_metadata_is_one_line(tmp_path, run_command):
    """Through ``prada_jax.cli.run`` at the default verbosity: a garbage
    ``_CHECKPOINT_METADATA`` in the newest step gives exactly one stderr line (the fallback
    warning naming the file), in every step exactly one ``error:`` line (exit 2); orbax's own
    ``E... Failed to json parse`` line comes back with ``--verbosity=0``. The default-verbosity
    runs are in-process; the ``--verbosity=0`` run is a real subprocess (it is the one that
    must see orbax's logging as a fresh interpreter sets it up, and an in-process
    ``--verbosity`` would stay marked as given for later tests)."""
    mod_dir = tmp_path / "mod"
    mod_dir.mkdir()
    ck_dir = tmp_path / "ck"
    _save_steps(ck_dir)
    bad = _garbage_metadata(ck_dir, 2)
    proc = _resume_here(run_command, mod_dir, ck_dir)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 0 and proc.stdout.strip() == "resumed 1 1.0", proc.stderr
    assert len(lines) == 1 and lines[0].startswith("warning: checkpoint step 2 is damaged: ") \
        and str(bad) in lines[0] and "falling back to step 1" in lines[0], proc.stderr

    _save_steps(tmp_path / "ck2")
    for s in (1, 2):
        _garbage_metadata(tmp_path / "ck2", s)
    proc = _resume_here(run_command, mod_dir, tmp_path / "ck2")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: no intact checkpoint to resume from") \
        and "2/_CHECKPOINT_METADATA" in lines[0]
    verbose = _resume(tmp_path / "ck2", "--verbosity=0")
    assert verbose.returncode == 2 and "Failed to json parse Metadata file" in verbose.stderr


# ----------------------------------------------------------------------------- float32 range

def test_check_float32_matches_numpy_rounding():
    """A float field is refused iff it is not finite (NaN, ±inf), or NumPy's float32 rounding
    turns it into inf or a non-zero value into 0; ints (not named as seeds) and bools pass. inf
    passes only in a field of ``INFINITE_OK``. The message names the field as typed
    (``--config.a.b``, list items ``[i]``)."""
    from ml_collections import ConfigDict

    from prada_jax import config_utils

    f32max = float(np.finfo(np.float32).max)
    values = [0.0, -0.0, 1.0, 1e-3, 1e30, 3e38, f32max, -f32max, np.nextafter(f32max, np.inf),
              3.4028236e38, 3.5e38, 1e39, -1e300, 1e300, 1e-40, 1e-45, 7e-46, 1e-46, -1e-50,
              float("inf"), float("-inf"), float("nan"), 2.5e-310]
    for v in values:
        v = float(v)
        with np.errstate(over="ignore", under="ignore"):
            r = np.float32(v)
        refused = bool(not np.isfinite(v) or np.isinf(r) or (v != 0 and r == 0))
        cfg = ConfigDict({"a": {"b": v, "n": 10 ** 40, "flag": True}, "c": [1.0, 2]})
        if refused:
            with pytest.raises(config_utils.ConfigError, match=r"^--config\.a\.b="):
                config_utils.check_float32(cfg, "--config")
        else:
            config_utils.check_float32(cfg, "--config")
        # a field documented to take inf accepts ±inf, nothing else that is refused above
        ok_inf = ConfigDict({"sampler": {"auto_gap_max": v}})
        if refused and not np.isinf(v):
            with pytest.raises(config_utils.ConfigError, match=r"auto_gap_max="):
                config_utils.check_float32(ok_inf, "--config")
        else:
            config_utils.check_float32(ok_inf, "--config")
    with pytest.raises(config_utils.ConfigError, match=r"^--x\.c\[1\]=1e\+39: does not fit"):
        config_utils.check_float32({"c": [1.0, 1e39]}, "--x")


def test_infinite_ok_fields_exist_and_document_inf():
    """Every field allowed to be inf exists in a config whose comment says what inf means."""
    from prada_jax import config_utils

    cfg_dir = Path(__file__).resolve().parents[1] / "prada_jax" / "configs"
    texts = {p.stem: p.read_text() for p in cfg_dir.glob("*.py")}
    for field in config_utils.INFINITE_OK:
        leaf = field.rsplit(".", 1)[-1]
        hits = [name for name, text in texts.items()
                if re.search(rf"c\.{re.escape(field)}\s*=.*", text)]
        assert hits, f"{field} is in no config"
        text = texts[hits[0]]
        after = text[text.index(f"c.{field}"):].split("\n    c.", 1)[0]
        assert "inf" in after.replace("info", ""), (field, leaf, after)


def test_every_config_field_passes_and_every_float_field_refuses_inf():
    """Generic over the configs: each config's defaults (every variant) pass; each of its float
    fields, set to inf, nan or 1e300, is refused naming that field, whatever section it is in
    (a field added later is covered without a list)."""
    import importlib

    from prada_jax import config_utils

    for name in ("ppo", "dual", "distill"):
        mod = importlib.import_module(f"prada_jax.configs.{name}")
        variants = [None] + [v for v in getattr(mod, "VARIANTS", ())]
        for variant in variants:
            config_utils.check_float32(mod.get_config(variant), "--config")
        cfg = mod.get_config()
        floats = [f for f, v in config_utils._leaves(cfg.to_dict()) if isinstance(v, float)]
        assert len(floats) >= 5, (name, floats)
        for field in floats:
            for bad in (float("inf"), float("nan"), 1e300, 1e-320):
                if bad == float("inf") and field in config_utils.INFINITE_OK:
                    continue
                c = mod.get_config()
                config_utils.set_field(c, field, bad)
                with pytest.raises(config_utils.ConfigError,
                                   match=rf"^--config\.{re.escape(field)}="):
                    config_utils.check_float32(c, "--config")


def test_seed_bound_keeps_every_derived_seed_inside_the_prng_range():
    """The seed bound against the PRNG itself: ``jax.random.key`` keeps 32 bits (2**32 gives the
    key of seed 0, so an unbounded seed silently repeats another run); the largest seed a run
    can derive from accepted flags (test-split base + SEED_MAX + SEED_COUNT_MAX) is a distinct,
    unwrapped int32 key. Seeds and counts outside the bound are refused, naming the field."""
    import jax

    from prada_jax import config_utils
    from prada_jax.traces import splits

    assert (jax.random.key_data(jax.random.key(2 ** 32)) ==
            jax.random.key_data(jax.random.key(0))).all()
    top = splits.TEST_SEED_BASE + splits.SEED_RANGE + config_utils.SEED_MAX + \
        config_utils.SEED_COUNT_MAX
    assert top <= np.iinfo(np.int32).max
    assert int(jax.random.key_data(jax.random.key(top))[-1]) == top
    assert int(np.asarray(top, np.int32)) == top
    ok = {"seed": config_utils.SEED_MAX, "env": {"trace_seed": 0, "seed0": 5},
          "num_seeds": config_utils.SEED_COUNT_MAX, "n": 2 ** 40}
    config_utils.check_float32(ok, "--config")
    for field, bad in (("seed", config_utils.SEED_MAX + 1), ("seed", -1),
                       ("env.trace_seed", 2 ** 63 - 1), ("env.seed0", 2 ** 32),
                       ("num_seeds", config_utils.SEED_COUNT_MAX + 1)):
        c = json.loads(json.dumps(ok))
        config_utils.set_field(c, field, bad)
        with pytest.raises(config_utils.ConfigError, match=rf"^--config\.{field}={bad}: must lie"):
            config_utils.check_float32(c, "--config")


@pytest.mark.parametrize("field,value", [("dual.kp", float("inf")), ("seed", 2 ** 32),
                                         ("dual.step_size", 1e300)])
def test_a_config_built_in_code_is_checked_before_a_trainer_writes(tmp_path, field, value):
    """Every trainer's first call on a workdir (``run_state.check_resume``) applies the same
    rule to a config built in code (studies.stage2_verdict, train.main), before anything is written."""
    from prada_jax import config_utils
    from prada_jax.configs import dual

    cfg = dual.get_config("smoke")
    config_utils.set_field(cfg, field, value)
    with pytest.raises(config_utils.ConfigError, match=rf"^config\.{re.escape(field)}="):
        run_state.check_resume(cfg, tmp_path / "run", ())
    assert not (tmp_path / "run").exists()


def test_flag_values_are_checked_generically():
    """Any float flag (a multi-float flag item by item) and any seed flag of a command,
    defined or not yet defined when this was written, goes through the same rule."""
    from absl import flags

    from prada_jax import cli
    from prada_jax.errors import BadInput

    fv = flags.FlagValues()
    flags.DEFINE_float("new_profile_peak_flops", 1.0, "", flag_values=fv)
    flags.DEFINE_multi_float("grid", [1.0], "", flag_values=fv)
    flags.DEFINE_integer("judge_seed", 0, "", flag_values=fv)
    flags.DEFINE_integer("steps", 0, "", flag_values=fv)
    fv(["prog", "--steps=99999999999999"])
    cli.check_flag_values(fv)
    for arg, names in (("--new_profile_peak_flops=inf", "--new_profile_peak_flops=inf"),
                       ("--new_profile_peak_flops=1e39", "--new_profile_peak_flops=1e+39"),
                       ("--grid=1e-320", "--grid=1e-320"),
                       ("--judge_seed=4294967296", "--judge_seed=4294967296")):
        fv.unparse_flags()
        fv(["prog", arg])
        with pytest.raises(BadInput, match=rf"^{re.escape(names)}: "):
            cli.check_flag_values(fv)
        fv.unparse_flags()


# ----------------------------------------------------------------------------- trace folders

@pytest.mark.parametrize("name", ["meta.json", "nodes.safetensors"])
def test_a_trace_file_that_is_not_a_regular_file_is_named_as_what_it_is(tmp_path, name):
    """A trace file that is a symlink to the zero device (a character device), a FIFO, a
    directory or a dangling symlink is refused naming what it is, not as "missing"; a file
    that is really absent is "missing"."""
    import stat

    from prada_jax.traces import format as tf
    from prada_jax.traces import synthetic

    traces, meta = synthetic.generate("gsm8k", seed=0, problems=4)
    zero = Path(os.devnull).with_name("zero")
    assert stat.S_ISCHR(zero.stat().st_mode)   # the zero device, a character device
    fifo = tmp_path / "named_pipe"
    os.mkfifo(fifo)
    cases = {"chr": (lambda p: p.symlink_to(zero),
                     rf"is a character device \(a symlink to {zero}\), not a regular file"),
             "fifo": (lambda p: p.symlink_to(fifo), r"is a FIFO \(named pipe\) \(a symlink to"),
             "dir": (lambda p: p.mkdir(), r"is a directory, not a regular file"),
             "dangling": (lambda p: p.symlink_to(tmp_path / "nowhere"),
                          r"is a symlink to .*nowhere, which does not exist"),
             "absent": (lambda p: None, r"missing$")}
    for label, (make, want) in cases.items():
        folder = tmp_path / label
        tf.save(traces, folder, meta)
        (folder / name).unlink()
        make(folder / name)
        with pytest.raises(tf.TraceFormatError, match=rf"{name}: field '<file>': {want}"):
            tf.load(folder)


def test_an_empty_trace_set_is_reported_as_empty(tmp_path):
    """A meta.json counting 0 problems (with empty splits) is refused as an empty trace set,
    not through its split check ("splits.train is empty")."""
    from prada_jax.traces import format as tf
    from prada_jax.traces import synthetic

    traces, meta = synthetic.generate("gsm8k", seed=0, problems=4)
    tf.save(traces, tmp_path / "t", meta)
    stored = json.loads((tmp_path / "t" / tf.META_FILE).read_text())
    stored["counts"] = {"problems": 0, "nodes": 0}
    stored["splits"] = {"train": [], "validation": [], "test": []}
    (tmp_path / "t" / tf.META_FILE).write_text(json.dumps(stored))
    with pytest.raises(tf.TraceFormatError,
                       match=r"meta\.json: field 'counts': empty trace set \(0 problems, 0 nodes\)"):
        tf.read_meta(tmp_path / "t")


def test_a_linked_meta_json_is_not_said_to_be_hash_checked(tmp_path, run_command):
    """The note on a meta.json symlinked from outside says what is true: its format is checked,
    no hash pins it (the content hash covers nodes.safetensors only: a changed meta.json
    behind the link that stays well-formed loads). A linked nodes.safetensors is said to be
    checked against the content hash (and other bytes are refused: the test below)."""
    from prada_jax.traces import format as tf
    from prada_jax.traces import synthetic

    traces, meta = synthetic.generate("gsm8k", seed=0, problems=4)
    linked = tmp_path / "linked"
    tf.save(traces, linked, meta)
    shared = tmp_path / "shared" / tf.META_FILE
    shared.parent.mkdir()
    (linked / tf.META_FILE).rename(shared)
    (linked / tf.META_FILE).symlink_to(shared)
    code, stdout, stderr = run_command("prada_jax.traces", "validate", str(linked))
    assert code == 0 and not stderr.strip(), stderr
    assert (f"meta.json is a symlink to {shared.resolve()}, outside the folder (followed; its "
            "format checked, but no hash pins its content)") in stdout
    assert "content hash checked" not in stdout
    stored = json.loads(shared.read_text())
    stored["generator"] = {"edited": True}     # content changed behind the link: still loads
    shared.write_text(json.dumps(stored))
    assert tf.load(linked).prm.shape == traces.prm.shape


def test_validate_reports_outside_symlinks_and_unknown_meta_keys(tmp_path, run_command):
    """A ``nodes.safetensors`` that is a symlink to a file outside the folder is followed and
    named by ``validate`` (with its target); ``meta.json`` keys no reader uses are listed as
    kept for provenance; the content hash still pins the linked bytes."""
    from prada_jax.traces import format as tf
    from prada_jax.traces import synthetic

    traces, meta = synthetic.generate("gsm8k", seed=0, problems=4)
    plain, linked = tmp_path / "plain", tmp_path / "linked"
    tf.save(traces, plain, meta)
    tf.save(traces, linked, meta)
    shared = tmp_path / "shared" / "nodes.safetensors"
    shared.parent.mkdir()
    (linked / tf.NODES_FILE).rename(shared)
    (linked / tf.NODES_FILE).symlink_to(shared)
    stored = json.loads((linked / tf.META_FILE).read_text())
    stored.update(zz_note="built on box 3", notes={"by": "me"})
    (linked / tf.META_FILE).write_text(json.dumps(stored))

    # in-process (the real prada_jax.traces entry runs as a subprocess in test_cli_errors.py)
    code, stdout, stderr = run_command("prada_jax.traces", "validate", str(plain), str(linked))
    assert code == 0 and not stderr.strip(), stderr
    out = stdout.strip().splitlines()
    assert len(out) == 2 and out[0].startswith(f"{plain}: OK (") and out[0].endswith(")")
    assert out[1].startswith(f"{linked}: OK (")
    assert (f"nodes.safetensors is a symlink to {shared.resolve()}, outside the folder "
            "(followed; its bytes checked against meta.json's content_hash)") in out[1]
    assert "meta.json keys not read by prada_jax, kept as provenance: notes, zz_note" in out[1]
    assert tf.validate_notes(plain, tf.read_meta(plain)) == []      # nothing to say
    # the link is pinned by the content hash: other bytes behind it are refused
    other, _ = synthetic.generate("gsm8k", seed=1, problems=4)
    tf.save(other, tmp_path / "other", meta)
    shared.write_bytes((tmp_path / "other" / tf.NODES_FILE).read_bytes())
    with pytest.raises(tf.TraceFormatError, match="content_hash"):
        tf.load(linked)
