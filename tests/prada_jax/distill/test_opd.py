"""Online OPD (``prada_jax.distill.opd``, ``config.mode = "opd"``): the student, not the teacher,
generated the supervised tokens; tool calls against an independent count; teacher scores against
a direct PyTorch forward; the step's loss against a NumPy reverse-KL estimate; the trainer's
cost counters, simulated tool latency and bad input."""
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from prada_jax import config_utils as cu  # noqa: E402
from prada_jax.distill import opd as opd_lib  # noqa: E402
from prada_jax.distill import task_registry as tasks_lib  # noqa: E402
from prada_jax.distill.task import arith, common  # noqa: E402
from prada_jax.lm.config import LMConfig  # noqa: E402
from prada_jax.lm.model import CausalLM  # noqa: E402
from tests.helpers.distill import cache  # noqa: E402,F401 (the module-scoped fixture)
from tests.helpers.distill import smoke_config as _config, tb_scalars as _scalars  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
# the deterministic student's every turn: recognisable, and never an action of the pool
SCRIPT = "<calc>2+3</calc>"


def bigram_student(script: str = SCRIPT, scale: float = 60.0):
    """A CausalLM whose next token depends only on the current one (attention and MLP outputs
    zeroed, one-hot embeddings, an untied head): after ``</q>`` or ``</res>`` it writes
    ``script`` and stops at its last token, whatever the temperature near 1."""
    V, D = len(arith.VOCAB), 32
    cfg = LMConfig(vocab_size=V, hidden_size=D, intermediate_size=16, num_layers=1, num_heads=2,
                   num_kv_heads=1, head_dim=16, tie_word_embeddings=False,
                   pad_token_id=arith.PAD_ID, eos_token_id=arith.EOS_ID, arch="qwen2")
    model = CausalLM(cfg, rngs=nnx.Rngs(params=0))
    ids = arith.encode(script)
    nxt = {arith.TOKEN_ID["</q>"]: ids[0], arith.TOKEN_ID["</res>"]: ids[0]}
    nxt.update(zip(ids[:-1], ids[1:]))
    emb = np.zeros((V, D), np.float32)
    emb[np.arange(V), np.arange(V)] = 1.0
    head = np.zeros((D, V), np.float32)
    for v in range(V):
        head[v, nxt.get(v, arith.EOS_ID)] = scale
    model.embed_tokens.embedding.value = jnp.asarray(emb)
    model.lm_head.kernel.value = jnp.asarray(head)
    for layer in model.layers:
        layer.self_attn.o_proj.kernel.value = jnp.zeros_like(layer.self_attn.o_proj.kernel.value)
        layer.mlp.down_proj.kernel.value = jnp.zeros_like(layer.mlp.down_proj.kernel.value)
    return model, cfg


def _gen(model, n, key=0):
    graphdef, params = nnx.split(model, nnx.Param)
    return opd_lib.student_generate_fn(
        graphdef, params, jax.random.key(key), batch=n, context_len=96, max_new_tokens=12,
        temperature=1.0, top_p=1.0, stop_ids=arith.STOP_IDS, pad_id=arith.PAD_ID)


def _row_seqs(batch):
    """Each row's full sequence (real prompt tokens, then the action), read off the batch."""
    out = []
    for r in range(batch["prompt"].shape[0]):
        g = int(batch["action_mask"][r].sum())
        if g:
            p = batch["prompt"][r][batch["prompt_mask"][r] == 1].tolist()
            out.append((r, p, batch["action"][r, :g].tolist()))
    return out


def test_round_student_tokens_tool_calls_teacher_scores_and_loss(cache):
    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill.learner import init_state, make_optimizer, make_train_step
    from prada_jax.distill.scoring import load_teacher

    task = tasks_lib.get(arith.TASK_NAME)
    pool = pool_lib.load_pool(cache / "pool")
    problems = task.pool_problems(pool)
    # the parsed problems are the pool's: their reference episodes re-encode to its questions
    assert [arith.encode(p.question) for p in problems] == tasks_lib.pool_questions(pool)
    n_ep = 2
    student, _ = bigram_student()
    scorer = task.teacher_scorer(cache / "teacher", 4)
    calls0 = arith.TOOL_CALLS.calls
    batch, st, episodes = opd_lib.opd_round(
        task, problems[:n_ep], _gen(student, n_ep), scorer, rows=n_ep * task.max_turns,
        context_len=96, action_len=12)
    rows = _row_seqs(batch)
    # the student wrote every supervised token: each turn is its script, which the teacher's
    # pool never holds
    script = arith.encode(SCRIPT)
    assert rows and all(a == script for _, _, a in rows)
    assert SCRIPT not in "".join(arith.decode(pool.tokens[s:e])
                                 for s, e in zip(pool.turn_starts, pool.turn_ends))
    # the script never answers: every episode runs to the turn cap, one tool call per turn
    assert len(rows) == st.supervised_turns == n_ep * task.max_turns
    # tool calls: the trainer's count (the calculator's counter) against the tool replies in
    # the episodes and the calc actions in the rows, counted here
    replies = sum(m["role"] == "tool" for ep in episodes for m in ep.messages)
    calc_rows = sum(arith.decode(a).startswith("<calc>") for _, _, a in rows)
    assert st.tool_calls == arith.TOOL_CALLS.calls - calls0 == replies == calc_rows
    assert st.student_tokens == st.teacher_tokens_scored == len(rows) * len(script)
    # teacher scores == a direct PyTorch forward of the teacher on each row's own sequence
    teacher = load_teacher(cache / "teacher")
    t_direct = {}
    with torch.no_grad():
        for r, p, a in rows:
            x = torch.tensor([p + a])
            lp = torch.log_softmax(teacher(input_ids=x).logits[0].double(), -1).numpy()
            t_direct[r] = np.array([lp[len(p) - 1 + j, tok] for j, tok in enumerate(a)])
            np.testing.assert_allclose(batch["teacher_logp"][r, :len(a)], t_direct[r],
                                       rtol=1e-4, atol=1e-4)
    # the jitted step's loss and KL == a NumPy reverse-KL estimate from direct forwards
    rng_student = CausalLM(LMConfig(vocab_size=len(arith.VOCAB), hidden_size=16,
                                    intermediate_size=32, num_layers=1, num_heads=2,
                                    num_kv_heads=1, head_dim=8, tie_word_embeddings=True),
                           rngs=nnx.Rngs(params=3))
    # one forward over every row's own sequence, right-padded (causal: padding after a token
    # changes nothing before it)
    L = max(len(p) + len(a) for _, p, a in rows)
    ids = np.zeros((len(rows), L), np.int32)
    mask = np.zeros((len(rows), L), np.int32)
    for i, (_, p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)], mask[i, :len(p) + len(a)] = p + a, 1
    # jitted: an eager NNX forward compiles every op on its own
    z = np.asarray(nnx.jit(lambda m, i, k: m(i, k))(rng_student, ids, mask), np.float64)
    z = z - z.max(-1, keepdims=True)
    ls_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    lp_s, lp_t = [], []
    for i, (r, p, a) in enumerate(rows):
        lp_s += [ls_all[i, len(p) - 1 + j, tok] for j, tok in enumerate(a)]
        lp_t += list(t_direct[r])
    lp_s, lp_t = np.array(lp_s), np.array(lp_t)
    adv = lp_s - lp_t
    tx = make_optimizer(1e-3, 1, 10, 0.0, 1.0, 1)
    gd, state = init_state(rng_student, tx, jax.random.key(0))
    step = make_train_step(gd, tx, "onpolicy", "rkl", num_turns=task.max_turns)
    _, m = step(state, batch)
    np.testing.assert_allclose(float(m["kl"]), adv.mean(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(m["loss"]), (adv * lp_s).mean(), rtol=1e-4, atol=1e-5)


def test_tool_latency_is_paid_once_per_turn_round(cache, monkeypatch):
    from prada_jax.distill import pool as pool_lib
    task = tasks_lib.get(arith.TASK_NAME)
    problems = task.pool_problems(pool_lib.load_pool(cache / "pool"))[:2]
    student, _ = bigram_student()
    gen = _gen(student, 2)
    scorer = lambda seqs: [{"logp_actual": np.zeros(len(s) - 1, np.float32),   # noqa: E731
                            "topk_ids": np.zeros((len(s) - 1, 1), np.int32),
                            "topk_logp": np.zeros((len(s) - 1, 1), np.float32),
                            "tail_mass": np.zeros(len(s) - 1, np.float32)} for s in seqs]
    kw = dict(rows=2 * task.max_turns, context_len=96, action_len=12)
    opd_lib.opd_round(task, problems, gen, scorer, **kw)          # compile
    _, st0, _ = opd_lib.opd_round(task, problems, gen, scorer, **kw)
    slept = []
    real_sleep = common.time.sleep
    monkeypatch.setattr(common.time, "sleep", lambda s: (slept.append(s), real_sleep(s)))
    _, st1, _ = opd_lib.opd_round(task, problems, gen, scorer, tool_delay_s=0.02, **kw)
    assert st1.tool_calls == st0.tool_calls == 2 * task.max_turns
    # the calls of a turn round run concurrently: one wait per round with a call (the count
    # the GPU cost model and the fair clock price), not one per call
    assert st1.tool_rounds == task.max_turns < st1.tool_calls
    assert slept == [0.02] * st1.tool_rounds
    assert st1.rollout_s >= 0.02 * st1.tool_rounds


def test_trainer_opd_counts_costs_against_independent_counts(cache, tmp_path):
    """A whole OPD run from the deterministic student: the trainer's tool-call and supervised-
    turn totals equal counts made by a wrapper around the task's environment."""
    from prada_jax.distill.trainer import train_and_evaluate
    from prada_jax.lm.hf import save_hf

    student, cfg = bigram_student()
    save_hf(student, cfg, tmp_path / "student", arch="qwen2")
    seen = {"tool_replies": 0, "turns": 0, "actions": []}
    base = tasks_lib.get(arith.TASK_NAME)

    def counted(problems, generate_fn, max_turns, tool_delay_s=0.0):
        eps = base.run_episodes(problems, generate_fn, max_turns, tool_delay_s=tool_delay_s)
        for ep in eps:
            for m in ep.messages:
                seen["tool_replies"] += m["role"] == "tool"
                if m["role"] == "assistant":
                    seen["turns"] += 1
                    seen["actions"].append(m["content"])
        return eps

    task = base._replace(run_episodes=counted)
    c = _config(cache, "opd", **{"student.init": str(tmp_path / "student"),
                                 "eval.n_problems": 0, "opd.episodes": 2,
                                 "opd.tool_latency_s": 0.005, "log.every": 1})
    res = train_and_evaluate(c, tmp_path / "run", task=task)
    cost = res["cost"]
    assert set(seen["actions"]) == {SCRIPT}   # every turn the student's
    assert cost["totals"]["tool_calls"] == seen["tool_replies"] == res["env_calls_during_training"]
    assert cost["totals"]["supervised_turns"] == seen["turns"] == 4 * 2 * base.max_turns
    assert cost["totals"]["episodes"] == 4 * 2
    for u in cost["per_update"]:
        assert u["rollout_s"] >= 0.005 * u["tool_rounds"]   # one wait per round with a call
    sc = _scalars(tmp_path / "run" / "tb")
    assert [s for s, _ in sc["cost/tool_calls"]] == [1, 2, 3, 4]
    assert sum(v for _, v in sc["cost/tool_calls"]) == seen["tool_replies"]
    assert sc["cost/total_supervised_turns"][-1][1] == seen["turns"]
    for tag in ("rollout_s", "scoring_s", "update_s", "student_tokens", "teacher_tokens_scored"):
        assert f"cost/{tag}" in sc
    timed = [u for u in cost["per_update"] if u["timed"]]
    assert not cost["per_update"][0]["timed"] and 1 <= len(timed) == cost["timed_updates"]
    assert cost["rollout_s_per_turn"] == pytest.approx(
        sum(u["rollout_s"] for u in timed) / sum(u["supervised_turns"] for u in timed))


def test_bad_opd_input(cache, tmp_path, run_command):
    from prada_jax.distill.validation import validate_config
    for field, value, msg in (("mode", "bogus", "config.mode"),
                              ("opd.tool_latency_s", -0.1, "config.opd.tool_latency_s"),
                              ("opd.episodes", 0, "config.opd.episodes")):
        c = _config(cache, "opd", **{field: value})
        with pytest.raises(cu.ConfigError, match=msg.replace(".", r"\.")):
            validate_config(c)
    # the command (in-process; the real entry runs as a subprocess in tests/test_cli_errors.py
    # and tests/train/test_distill.py): exit 2, one stderr line naming the field, nothing written
    before = sorted(tmp_path.rglob("*"))
    code, _, err = run_command("train.distill", "--config=prada_jax/configs/distill.py:smoke,opd",
                               f"--config.data.cache={cache}", f"--workdir={tmp_path / 'w'}",
                               "--config.opd.tool_latency_s=-1", cwd=ROOT)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-1500:]
    assert lines[0].startswith("error: ") and "opd.tool_latency_s" in lines[0]
    assert sorted(tmp_path.rglob("*")) == before


def _adam_and_sched(opt_state):
    import optax
    kinds = (optax.ScaleByAdamState, optax.ScaleByScheduleState)
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
    adam = [x for x in leaves if isinstance(x, optax.ScaleByAdamState)]
    sched = [x for x in leaves if isinstance(x, optax.ScaleByScheduleState)]
    assert len(adam) == 1 and len(sched) == 1
    return adam[0], sched[0]


def test_warm_start_carries_the_optimizer_state(cache, tmp_path):
    """``optim.carry_from``: the new run starts from the warm start's final AdamW moments and
    count (read back from its checkpoint here), its schedule count reset; a student that is not
    the warm start's, or an unfinished workdir, is refused."""
    from prada_jax.checkpointing import Checkpointer
    from prada_jax.distill import stepping
    from prada_jax.distill.trainer import build_setup, close_files, train_and_evaluate
    warm = tmp_path / "warm"
    train_and_evaluate(_config(cache, "sft", **{"eval.n_problems": 0}), warm)
    c = _config(cache, "onpolicy", **{"eval.n_problems": 0,
                                      "student.init": str(warm / "student_hf"),
                                      "optim.carry_from": str(warm)})
    run = stepping.open_run(build_setup(c), tmp_path / "next")
    try:
        with Checkpointer(warm / "checkpoints", create=False) as ck:
            ref, _ = ck.restore(run.state)
        adam, sched = _adam_and_sched(run.state.opt_state)
        ref_adam, ref_sched = _adam_and_sched(ref.opt_state)
        assert int(ref_adam.count) == 4 and int(adam.count) == 4
        assert int(ref_sched.count) == 4 and int(sched.count) == 0
        for a, b in zip(jax.tree.leaves((adam.mu, adam.nu)),
                        jax.tree.leaves((ref_adam.mu, ref_adam.nu))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert any(np.abs(np.asarray(x)).sum() > 0 for x in jax.tree.leaves(adam.nu))
    finally:
        close_files(run.files)
    fresh = tmp_path / "other"
    train_and_evaluate(_config(cache, "sft", seed=1, **{"eval.n_problems": 0}), fresh)
    bad = _config(cache, "onpolicy", **{"student.init": str(fresh / "student_hf"),
                                        "optim.carry_from": str(warm)})
    with pytest.raises(cu.ConfigError, match="not config.student.init"):
        stepping.open_run(build_setup(bad), tmp_path / "bad1")
    bad = _config(cache, "onpolicy", **{"student.init": str(warm / "student_hf"),
                                        "optim.carry_from": str(tmp_path / "nothing")})
    with pytest.raises(cu.ConfigError, match="not a finished distillation workdir"):
        stepping.open_run(build_setup(bad), tmp_path / "bad2")
    assert not (tmp_path / "bad1").exists() and not (tmp_path / "bad2").exists()


def test_gate_reached_stops_and_not_reached_is_reported(cache, tmp_path):
    """A gate that every student passes stops the run at the first check (and a rerun does
    nothing); one no student passes runs the whole budget and says so."""
    from prada_jax.distill.trainer import train_and_evaluate
    from train.distill import gate_line
    ov = {"gate.every": 2, "train.steps": 6, "sampler.refresh_every": 0}
    res = train_and_evaluate(_config(cache, "sft", **ov, **{"gate.success_min": 0.0,
                                                            "gate.gap_max": 1e9}),
                             tmp_path / "yes")
    g = res["gate"]
    assert g["reached"] and g["step"] == 2 and len(g["checks"]) == 1
    assert res["cost"]["updates"] == 2                       # stopped at the gate
    assert g["checks"][0]["mean_gap"] == res["ratio"][-1]["mean_gap"]
    assert gate_line(g).startswith("gate reached at update 2")
    again = train_and_evaluate(_config(cache, "sft", **ov, **{"gate.success_min": 0.0,
                                                              "gate.gap_max": 1e9}),
                               tmp_path / "yes")
    assert again["already_finished"] and again["gate"] == g
    res = train_and_evaluate(_config(cache, "sft", **ov, **{"gate.success_min": 1.0,
                                                            "gate.gap_max": 0.0}),
                             tmp_path / "no")
    g = res["gate"]
    assert not g["reached"] and [c["step"] for c in g["checks"]] == [2, 4, 6]
    assert res["cost"]["updates"] == 6 and "after" in res
    assert gate_line(g).startswith("gate not reached within 6 updates")
    with pytest.raises(cu.ConfigError, match="config.gate.every"):
        train_and_evaluate(_config(cache, "sft", **ov, **{"eval.n_problems": 0}),
                           tmp_path / "bad")


@pytest.mark.slow
def test_cli_gate_not_reached_is_exit_0_and_says_so(cache, tmp_path):
    """The command with a gate no student passes: exit 0, results written, one stdout line
    ``gate not reached ...`` (the fast guard of the gate's logic is the test above)."""
    p = subprocess.run([sys.executable, "-m", "train.distill",
                        "--config=prada_jax/configs/distill.py:smoke,sft",
                        f"--config.data.cache={cache}", f"--workdir={tmp_path / 'w'}",
                        "--config.gate.every=2", "--config.gate.success_min=1.0",
                        "--config.gate.gap_max=0.0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-1500:]
    assert any(line.startswith("gate not reached within 4 updates")
               for line in p.stdout.splitlines()), p.stdout
    assert (tmp_path / "w" / "results.json").is_file()


def test_pool_problems_of_both_tasks_are_the_pools_problems(tmp_path):
    """OPD plays the problems of the pool's own trajectories: arithmetic ones parsed from the
    questions, kg ones (hidden graphs) rebuilt from the recorder's seed and checked against
    every question; a pool whose seed draws other problems is refused."""
    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill.task import kg
    from prada_jax.distill.task.common import EpisodeResult
    from prada_jax.distill.task.kg_teacher import save_episodes
    from prada_jax.errors import BadInput
    probs = kg.make_problems(7 * 1000 + 2, 5)
    eps = [EpisodeResult(kg.solved_messages(p), True, 0, 0) for p in probs]
    save_episodes(eps, tmp_path / "kg", extra_meta={"source": {"seed": 7}})
    got = tasks_lib.get(kg.TASK_NAME).pool_problems(pool_lib.load_pool(tmp_path / "kg"))
    assert got == probs
    save_episodes(eps, tmp_path / "kg8", extra_meta={"source": {"seed": 8}})
    with pytest.raises(BadInput, match="does not match"):
        tasks_lib.get(kg.TASK_NAME).pool_problems(pool_lib.load_pool(tmp_path / "kg8"))
    ap = arith.make_problems(11, 6)
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p)) for p in ap))
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, [1] * 6), tmp_path / "ar",
                       {"task": arith.TASK_NAME,
                        "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer())})
    parsed = tasks_lib.get(arith.TASK_NAME).pool_problems(pool_lib.load_pool(tmp_path / "ar"))
    assert parsed == ap and [p.answer for p in parsed] == [p.answer for p in ap]
