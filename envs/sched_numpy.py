"""Reference schedulers (plain Python over candidate dicts), written independently of
``prada_jax.sched`` for the NumPy reference env (``envs.edge_numpy``) and the scheduler tests."""
from __future__ import annotations

SCHED_NAMES = ("keep_local", "offload_all", "random", "fifo_greedy", "threshold", "rsd",
               "threshold_fifo")
LOCAL, QUEUE, IMMEDIATE = 0, 1, 2


def _fill(order, wants, bw, free_units, free_bw):
    admitted = set()
    for i in order:
        if wants[i] and free_units >= 1 and bw[i] <= free_bw:
            admitted.add(i)
            free_units -= 1
            free_bw -= bw[i]
    return admitted


def schedule(name, cands, free_units, free_bw, cfg):
    """Reference schedulers over a list of candidate dicts; returns {index: decision}."""
    out = {}
    idx = [c["i"] for c in cands]
    by = {c["i"]: c for c in cands}
    bw = {i: by[i]["bw"] for i in idx}
    exp = {i: by[i]["wait"] >= cfg["max_wait_slots"] for i in idx}

    def finish(admitted, wants_queue):
        for i in idx:
            if i in admitted:
                out[i] = IMMEDIATE
            elif wants_queue[i] and not exp[i]:
                out[i] = QUEUE
            else:
                out[i] = LOCAL
        return out

    if name == "keep_local":
        return {i: LOCAL for i in idx}
    oldest = sorted(idx, key=lambda i: (-by[i]["wait"], i))  # arrival order, ties by slot
    if name == "offload_all":
        return finish(_fill(oldest, {i: True for i in idx}, bw, free_units, free_bw),
                      {i: True for i in idx})
    if name == "random":
        choice = {i: min(int(3.0 * by[i]["u"]), 2) for i in idx}
        admitted = _fill(oldest, {i: choice[i] == IMMEDIATE for i in idx}, bw, free_units,
                         free_bw)
        return finish(admitted, {i: choice[i] != LOCAL for i in idx})
    if name == "fifo_greedy":
        order = sorted(idx, key=lambda i: (-by[i]["wait"], i))
        return finish(_fill(order, {i: True for i in idx}, bw, free_units, free_bw),
                      {i: True for i in idx})
    if name == "rsd":
        wants = {i: by[i]["draft_prm"] < cfg["rsd_threshold"] for i in idx}
        return finish(_fill(oldest, wants, bw, free_units, free_bw), wants)
    if name in ("threshold", "threshold_fifo"):
        # Admission-price rule with each cost charged once (prada_jax.sched.threshold).
        # Expected wait over the units available this slot (M_t, at least 1), not the nominal M.
        m_t = max(int(cfg.get("num_servers_t", cfg["num_servers"])), 1)
        c_wait = cfg["beta"] * cfg["tau_s"] * (1.0 + cfg["queue_len"] / m_t)
        red, wants, gi, qok = {}, {}, {}, {}
        for i in idx:
            c = by[i]
            w = c["gain"] if cfg.get("policy_reward_mode", "coarse") == "true" else \
                c["gain"] - cfg["beta"] * c["comm"]
            g = w - (cfg["lambda_s"] + cfg["mu"] * c["bw"])
            wants[i] = (not exp[i]) and g >= 0.0
            qok[i] = g - c_wait > 0.0
            red[i] = c_wait if qok[i] else g  # value lost if rejected
            gi[i] = g
        key = (lambda i: (-red[i], -gi[i], i)) if name == "threshold" else \
            (lambda i: (-by[i]["wait"], i))     # the ablation: first come first served
        order = sorted([i for i in idx if wants[i]], key=key)
        admitted = _fill(order, wants, bw, free_units, free_bw)
        return finish(admitted, qok)
    raise ValueError(f"unknown scheduler {name!r}")

