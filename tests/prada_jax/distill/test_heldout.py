"""Held out means held out: the problems a task evaluates on and the held-out diagnostic pool
share no problem text with the training pool, as the code draws them (the teacher command's
and the task registry's own calls, captured), at the default sizes, for several seeds."""
import pytest

from prada_jax.distill import pool as pool_lib
from prada_jax.distill import task_registry as tasks
from prada_jax.distill.task import arith


def _questions(problems):
    """Arithmetic problems by their text (the question is the whole problem); kg problems
    whole, graph included (the lookup tool answers from the problem's own graph, so one
    question text can pose different problems)."""
    return {p.question if isinstance(p, arith.Problem) else p for p in problems}


def test_make_problems_split_keeps_only_that_split():
    """Each split's draws belong to it; the three are disjoint by text and together cover
    what an unsplit draw yields."""
    got = {s: arith.make_problems(7, 300, split=s) for s in arith.SPLITS}
    for s, probs in got.items():
        assert len(probs) == 300 and {arith.split_of(p.question) for p in probs} == {s}
    qs = [_questions(p) for p in got.values()]
    assert not (qs[0] & qs[1]) and not (qs[0] & qs[2]) and not (qs[1] & qs[2])
    # the unsplit stream, partitioned by split_of, is the split streams' prefix
    every = arith.make_problems(7, 600)
    for s in arith.SPLITS:
        mine = [p for p in every if arith.split_of(p.question) == s]
        k = min(len(mine), len(got[s]))
        assert k >= 30 and mine[:k] == got[s][:k]
    with pytest.raises(ValueError, match="split"):
        arith.make_problems(0, 1, split="test")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_teacher_command_pools_and_eval_are_disjoint(tmp_path, monkeypatch, seed):
    """``python -m prada_jax.distill.task.teacher`` with its default sizes (pool 512, eval 256,
    held-out pool 512), teacher training and export stubbed: the problems it hands to the
    evaluation and to the held-out pool never occur in the training pool. (Before the split,
    seed 0 evaluated 23 of its 256 questions verbatim from the pool.)"""
    from prada_jax.distill.task import teacher_cache
    from prada_jax.distill.task.teacher import __main__ as teacher_main

    seen = {}

    def fake_record_pool(model, problems, out_dir, jsonl_path=None, seed=0, extra_meta=None):
        seen["heldout" if (extra_meta or {}).get("split") == "heldout" else "pool"] = problems
        trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                             for p in problems))
        pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, [1] * len(problems)), out_dir,
                           {"task": arith.TASK_NAME,
                            "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer())})

    def fake_eval(model, problems, *a, **k):
        seen["eval"] = problems
        return {"success_rate": 1.0}

    # the command and the steps it shares (teacher_cache) import these at module level:
    # patch their own names
    monkeypatch.setattr(teacher_cache, "ensure_teacher", lambda *a, **k: None)
    monkeypatch.setattr(teacher_main, "record_pool", fake_record_pool)
    monkeypatch.setattr(teacher_main, "evaluate_torch", fake_eval)
    monkeypatch.setattr(teacher_cache, "export_logits", lambda *a, **k: None)
    assert teacher_main.main([f"--cache={tmp_path}", f"--seed={seed}"]) == 0
    pool = _questions(seen["pool"])
    assert len(seen["pool"]) == 512 and len(seen["eval"]) == 256
    assert len(seen["heldout"]) == 512
    assert not pool & _questions(seen["eval"]), "evaluation problems in the training pool"
    assert not pool & _questions(seen["heldout"]), "held-out problems in the training pool"
    assert not _questions(seen["eval"]) & _questions(seen["heldout"])


@pytest.mark.parametrize("task_name,pool_n,module,pool_fn", [
    ("arith_calc_v1", 512, "prada_jax.distill.task.teacher", "record_pool"),
    ("kg_lookup_v1", 4096, "prada_jax.distill.task.kg_teacher", "record_pool"),
])
def test_task_registry_evaluates_off_the_pool(monkeypatch, task_name, pool_n, module, pool_fn):
    """The trainer's path (``tasks.get(name).evaluate`` / ``.build_pool``) at the default
    sizes (256 evaluation problems; pools of 512 arithmetic / 4096 kg trajectories), seed 0."""
    import importlib
    seen = {}
    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, pool_fn,
                        lambda model, problems, *a, **k: seen.__setitem__("pool", problems))
    if task_name == "arith_calc_v1":
        from prada_jax.distill.task import evaluate as ev_mod
        monkeypatch.setattr(ev_mod, "evaluate_model",
                            lambda model, problems, **k: seen.__setitem__("eval", problems))
    else:
        from prada_jax.distill.task import kg
        monkeypatch.setattr(kg, "evaluate_model",
                            lambda model, problems, **k: seen.__setitem__("eval", problems))
    task = tasks.get(task_name)
    task.build_pool(None, "unused", n=pool_n, seed=0)
    task.evaluate(None, n_problems=256, seed=0, batch=64)
    assert len(seen["pool"]) == pool_n and len(seen["eval"]) == 256
    assert not _questions(seen["pool"]) & _questions(seen["eval"])
