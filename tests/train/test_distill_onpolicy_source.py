"""On-policy ReOPD: the sequences the teacher scores are the *student's* samples after a
replayed pool prefix. With the student initialised from the teacher's own weights and sampled
near-greedily, every token of the first round is the teacher's argmax at that position (as
the teacher's scores say); a random student, after the same prefixes, samples other tokens.
So the scored actions come from the student being trained, not from the pool or the
teacher."""
import numpy as np
import pytest

pytest.importorskip("torch")

from prada_jax import config_utils as cu  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from prada_jax.distill.task.teacher import tiny_cache
    return tiny_cache(tmp_path_factory.mktemp("cache"))


def _first_round(cache, workdir, **overrides):
    """(prefix lengths, sequences, teacher scores) of the first scoring round (the untrained
    student), recorded by wrapping the real teacher scorer."""
    from prada_jax.configs.distill import get_config

    from prada_jax.distill import task_registry as tasks
    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill.trainer import train_and_evaluate
    c = get_config("smoke,onpolicy")
    c.data.cache = str(cache)
    for k, v in {"train.steps": 1, "eval.n_problems": 0, "onpolicy.temperature": 1e-4,
                 **overrides}.items():
        cu.set_field(c, k, v)
    real = tasks.hf_teacher_scorer(cache / "teacher", c.loss.top_k)
    rounds = []

    def spy(seqs):
        scores = real(seqs)
        rounds.append((seqs, scores))
        return scores
    train_and_evaluate(c, workdir, teacher_score_fn=spy)
    seqs, scores = rounds[0]
    pool = pool_lib.load_pool(cache / "pool")
    tokens = np.asarray(pool.tokens)
    starts = np.asarray(pool.turn_starts)
    offs = np.asarray(pool.traj_offsets)
    # each sequence = a pool trajectory's tokens up to one of its agent turns + sampled tokens
    prefixes = {tuple(tokens[offs[np.searchsorted(offs, s, "right") - 1]:s]) for s in starts}
    lens = []
    for s in seqs:
        n = max(k for k in range(len(s) + 1) if tuple(s[:k]) in prefixes)
        assert 0 < n < len(s) <= n + c.onpolicy.max_new_tokens
        lens.append(n)
    return lens, seqs, scores


def _argmax_agreement(lens, seqs, scores):
    """Share of sampled tokens equal to the teacher's top-1 token at their position."""
    hit = tot = 0
    for n, s, sc in zip(lens, seqs, scores):
        top1 = np.asarray(sc["topk_ids"])[:, 0]
        for i in range(n, len(s)):          # entry i - 1 predicts token i
            hit += int(top1[i - 1] == s[i])
            tot += 1
    return hit / tot, tot


def test_scored_actions_are_the_students_samples(cache, tmp_path):
    t = _first_round(cache, tmp_path / "t", **{"student.init": str(cache / "teacher")})
    r = _first_round(cache, tmp_path / "r")
    same, n_same = _argmax_agreement(*t)
    other, n_other = _argmax_agreement(*r)
    assert n_same >= 8 and n_other >= 8
    assert same == 1.0, same            # student = teacher, near-greedy: the teacher's argmax
    # same seed, same pairs drawn: the same prefixes, but another student samples otherwise
    assert t[0] == r[0] and [s[:n] for n, s in zip(t[0], t[1])] == \
        [s[:n] for n, s in zip(r[0], r[1])]
    assert other < 1.0 and sum(a != b for a, b in zip(t[1], r[1])) >= 2
