"""The prefix-source study's post-verdict diagnostic (studies/reopd_prefix_source/diag.py) on a
tiny kg pool scored by a random teacher: T's mean log-prob of the action tokens (all, successful
and failed trajectories) against a direct torch forward pass, the call-form counts against the
chat messages the pool was built from, and the pool's success against its flags."""
import numpy as np
import pytest

from studies.reopd_prefix_source import diag

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_pool(tmp_path_factory):
    """A random kg teacher (hidden 16), a pool of 8 reference episodes with mixed call forms and
    alternating success flags, and the teacher's top-4 logit store on it."""
    from transformers import Qwen2ForCausalLM

    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill.task import kg
    from prada_jax.distill.task.export_local import export_logits
    from prada_jax.distill.task.kg_teacher import model_config

    root = tmp_path_factory.mktemp("diag")
    torch.manual_seed(3)
    Qwen2ForCausalLM(model_config(16, 1, 2, 1, 32)).save_pretrained(root / "teacher")
    kg.build_tokenizer().save_pretrained(root / "teacher")
    rng = np.random.default_rng(7)
    msgs = [kg.solved_messages(p, rng) for p in kg.make_problems(5, 8)]
    trajs, spans = zip(*(kg.messages_to_tokens(m) for m in msgs))
    success = [i % 2 for i in range(8)]
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, success), root / "pool",
                       {"task": kg.TASK_NAME, "synthetic": True,
                        "tokenizer": pool_lib.tokenizer_meta(kg.build_tokenizer())})
    export_logits(root / "teacher", root / "pool", root / "logits", top_k=4)
    return root, msgs, success


def test_pool_stats_match_a_direct_forward_pass(tiny_pool):
    from transformers import Qwen2ForCausalLM

    from prada_jax.distill import pool as pool_lib
    root, msgs, success = tiny_pool
    got = diag.pool_stats(str(root / "pool"), str(root / "logits"))

    pool = pool_lib.load_pool(root / "pool")
    model = Qwen2ForCausalLM.from_pretrained(root / "teacher").eval()
    toks, offs = np.asarray(pool.tokens), np.asarray(pool.traj_offsets)
    act = np.asarray(pool.action_mask).astype(bool)
    by_traj = []
    for i in range(pool.num_trajectories):
        a, b = int(offs[i]), int(offs[i + 1])
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor(toks[a:b][None].astype(np.int64)))
                                   .logits[0].double(), -1).numpy()
        by_traj.append([lp[j - a - 1, toks[j]] for j in range(a + 1, b) if act[j]])
    every = np.concatenate(by_traj)
    ok = np.concatenate([v for v, s in zip(by_traj, success) if s])
    bad = np.concatenate([v for v, s in zip(by_traj, success) if not s])
    assert got["T_logp_per_action_token"] == pytest.approx(every.mean(), abs=2e-2)  # fp16 store
    assert got["T_logp_successful"] == pytest.approx(ok.mean(), abs=2e-2)
    assert got["T_logp_failed"] == pytest.approx(bad.mean(), abs=2e-2)
    assert got["success"] == pytest.approx(np.mean(success))

    calls = [m["content"][6:-7] for ms in msgs for m in ms
             if m["role"] == "assistant" and m["content"].startswith("<call>")]
    assert got["calls_entity_first"] == sum(c[0].isupper() for c in calls)
    assert got["calls_relation_first"] == sum(c[0].islower() for c in calls)
    assert 0 < got["calls_entity_first"] < len(calls)      # both forms present: the split counts
