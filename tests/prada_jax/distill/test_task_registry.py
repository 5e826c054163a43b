"""The trainer does not know its task: task registry, no task imports in the loop, no import
cycle in the task package, the sampler's own schedule state."""
import subprocess
import sys

import numpy as np
import pytest

from prada_jax.distill import pool as P
from prada_jax.distill import task_registry as tasks
from prada_jax.distill.sampler import TurnSampler, exact_ratio_probs, pair_weights
from prada_jax.distill.task import arith
from prada_jax.errors import BadInput


def _modules_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_loop_imports_no_task_and_export_local_not_teacher():
    mods = _modules_after("import prada_jax.distill.trainer")
    assert "prada_jax.distill.task_registry" in mods
    assert not {m for m in mods if m.startswith("prada_jax.distill.task.")
                or m == "prada_jax.distill.task"}
    mods = _modules_after("import prada_jax.distill.task.export_local")
    assert "prada_jax.distill.task.teacher" not in mods


def test_registry(monkeypatch):
    t = tasks.get(arith.TASK_NAME)
    assert (t.pad_id, t.eos_id, t.stop_ids) == (arith.PAD_ID, arith.EOS_ID, arith.STOP_IDS)
    before = t.tool_calls()
    arith.calculator("1+2")
    assert t.tool_calls() == before + 1
    with pytest.raises(BadInput, match="unknown distillation task 'nope'"):
        tasks.get("nope")
    g = tasks.for_pool({"task": "chat_jsonl"})
    assert g.name == "chat_jsonl" and g.evaluate is None and g.stop_ids == ()
    # the pool's task routes evaluation to the arithmetic evaluator, on eval.seed's problems
    from prada_jax.distill.task import evaluate as ev_mod
    seen = []
    monkeypatch.setattr(ev_mod, "evaluate_model",
                        lambda model, problems, batch: seen.append((problems, batch)) or {})
    tasks.for_pool({"task": arith.TASK_NAME}).evaluate("model", 5, 1, 8)
    assert seen == [(arith.make_problems(1 * 1000 + 3, 5, split="eval"), 8)]


def _pool(tmp_path):
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(3, 9)))
    P.save_pool(P.build_arrays(trajs, spans, [1] * 9), tmp_path / "pool",
                {"task": arith.TASK_NAME, "tokenizer": P.tokenizer_meta(arith.build_tokenizer())})
    return P.load_pool(tmp_path / "pool")


def test_sampler_schedule_methods_and_state_roundtrip(tmp_path):
    pool = _pool(tmp_path)
    s = TurnSampler(pool, kappa=0.6)
    s.use_kappa(0.3)
    np.testing.assert_allclose(s.probs, pair_weights(pool, 0.3), rtol=1e-12)
    assert s.kappa == 0.3 and s.log_ratio is None
    lr = -np.linspace(0.0, 8.0, s.probs.size)
    low = s.use_log_ratio(lr)
    np.testing.assert_allclose(s.probs, exact_ratio_probs(pool, lr, 1e-3, 10.0), rtol=1e-12)
    assert low == pytest.approx(np.mean(lr < np.log(1e-3)))
    for src in (s, TurnSampler(pool, kappa=0.6)):
        if src is not s:
            src.use_kappa(0.45)
        dst = TurnSampler(pool, kappa=0.9)
        dst.load_schedule_state(src.schedule_state())
        np.testing.assert_array_equal(dst.probs, src.probs)
        assert dst.kappa == src.kappa
