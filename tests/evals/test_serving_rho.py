"""ρ under the serving server at M > 1 (issue 43's guard): the evaluation's offered load of the
server LLM alone at half its closed-form capacity reads ≈ 0.5, so a ρ not divided by the M
sequence slots (or not summing each job's share) fails here."""
import numpy as np

from envs import edge
from evals import evaluate as ev
from evals import suite
from prada_jax.traces import synthetic

from tests.helpers.serving import llm_alone_cost_by_hand


def test_rho_of_the_llm_alone_at_m_64_is_its_offered_share():
    traces = synthetic.generate("gsm8k", seed=0, problems=64)[0]
    cost = llm_alone_cost_by_hand(traces, 64)          # server-seconds per user, by hand
    rate = 0.5 / cost.mean()
    params = edge.make_params(traces, num_users=256, hardware="a100_orin_int4", num_servers=64,
                              arrival_rate_hz=rate, initial_users=0)
    e = ev.Evaluator(params, seeds=2, num_slots=1400, warmup_slots=400, drain_slots=200)
    m = e.run(ev.PolicySpec("All-LLM", "always", "offload_all"), **suite.LLM_ONLY_OVERRIDES)
    assert np.all(np.abs(m["rho"] - 0.5) < 0.1), m["rho"]
    assert np.all(m["blocked_rate"] == 0)
    assert np.all(m["server_batch"] > 10) and np.all(m["server_batch"] < 64)
