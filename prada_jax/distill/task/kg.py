"""Multi-hop questions over a small generated knowledge graph with a ``lookup`` tool.

The second built-in ReOPD task (``kg_lookup_v1``), built to leave the distillation methods room
to differ: long horizons (5-11 agent turns), tool replies that decide the next action, two
valid call forms, and a teacher sampled at a temperature. All data is synthetic and
deterministic from a seed.

Each problem carries its own hidden graph over :data:`ENTITIES` (16 entities ``A``-``P``):
every entity has the four *link* relations ``a b c d`` (to another entity) and the two numeric
*attributes* ``x y`` (a digit 0-9, one token). The agent sees only the question; the graph is
reachable only through the tool, and every relation the question does not name is a
distractor. A question names two chains and a combiner::

    user:      <q>Kcax;Fby<max></q>     chain 1: K -c-> ? -a-> ? then attribute x;
                                        chain 2: F -b-> ? then attribute y; answer max
    assistant: <call>Kc</call>          agent turn t = 0: lookup(K, c)
    tool:      <res>D</res>
    assistant: <call>aD</call>          t = 1: the same call in the other argument order
    tool:      <res>M</res>
    assistant: <call>Mx</call>          t = 2: attribute x of M
    tool:      <res>7</res>
    assistant: <call>Fb</call>          t = 3: chain 2
    tool:      <res>B</res>
    assistant: <call>By</call>          t = 4
    tool:      <res>3</res>
    assistant: <ans>7<max>3=7</ans>     t = 5: the answer: both values, the combiner, result

The episode succeeds iff the answer is the worked step ``v1 op v2 = result`` with both
retrieved values (in either order), the question's combiner and the right result
(:func:`answer_ok`): a guessed digit does not pass (a bare result would succeed by chance about
one time in six). The worked step also makes the last turn learnable: each token is one
retrieval or one comparison of the three tokens before it; with a bare answer neither a
3-layer teacher nor the student learnt the far-back compare in their budgets.

A chain with h link relations (h in [1, 4]) needs h + 1 calls, so a problem has
h1 + h2 + 3 agent turns (5-11). Each call's entity is the previous reply (or the chain's
start), so an early wrong relation sends the rest of the episode through entities the
reference solution never visits. The tool, :func:`lookup`, accepts exactly one entity and one
relation in either order (``<call>Kc</call>`` or ``<call>cK</call>``) and answers
``<res><err></res>`` to anything else. Every tool call increments :data:`TOOL_CALLS`, so a
trainer can prove it made none.

Tokens: one id per character or tag (:data:`VOCAB`, 47 ids). :func:`build_tokenizer` wraps the
vocabulary into a ``PreTrainedTokenizerFast`` whose chat template concatenates the messages, so
the generic JSONL converter reproduces :func:`messages_to_tokens`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from prada_jax.distill.task import common
from prada_jax.distill.task.common import EpisodeResult, GenerateFn, ToolCounter
from prada_jax.distill.task.evaluate import wilson_ci
from prada_jax.lm.sampling import contexts_generate_fn

ENTITIES: tuple[str, ...] = tuple("ABCDEFGHIJKLMNOP")
LINKS: tuple[str, ...] = ("a", "b", "c", "d")
ATTRS: tuple[str, ...] = ("x", "y")
OPS: tuple[str, ...] = ("<max>", "<min>")
VOCAB: tuple[str, ...] = (
    ("<pad>", "<eos>") + tuple("0123456789") + ENTITIES + LINKS + ATTRS
    + (";", "=", "<q>", "</q>", "<call>", "</call>", "<res>", "</res>", "<ans>", "</ans>", "<err>")
    + OPS)
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
PAD_ID = TOKEN_ID["<pad>"]
EOS_ID = TOKEN_ID["<eos>"]
CALL_END_ID = TOKEN_ID["</call>"]
ANS_END_ID = TOKEN_ID["</ans>"]
STOP_IDS = (CALL_END_ID, ANS_END_ID)
TASK_NAME = "kg_lookup_v1"
CHAT_TEMPLATE = common.CHAT_TEMPLATE
MAX_TURNS = 14            # an episode still running after this many agent turns fails
MIN_HOPS, MAX_HOPS = 1, 4  # link relations per chain
VALUE_RANGE = (0, 9)       # attribute values, inclusive (one digit token)
MAX_ACTION_TOKENS = 7      # longest reference action: <ans>7<max>3=7</ans>
ERR_REPLY = "<res><err></res>"


TOOL_CALLS = ToolCounter()  # ``lookup`` calls


def encode(text: str) -> list[int]:
    """Text -> token ids. Raises ValueError naming an unknown symbol."""
    return common.encode(text, TOKEN_ID, "knowledge-graph")


def decode(ids: Sequence[int]) -> str:
    return common.decode(ids, VOCAB)


@dataclass(frozen=True)
class Problem:
    """One question and its hidden graph.

    ``links[e][r]`` is the entity index reached from entity ``e`` by link relation ``r``
    (16 x 4), ``attrs[e][k]`` the value of attribute ``k`` of entity ``e`` (16 x 2);
    ``starts``, ``paths`` (link-relation indices per chain), ``attr`` (attribute index per
    chain) and ``op`` (0 = max, 1 = min) define the question.
    """

    links: tuple[tuple[int, ...], ...]
    attrs: tuple[tuple[int, ...], ...]
    starts: tuple[int, int]
    paths: tuple[tuple[int, ...], tuple[int, ...]]
    attr: tuple[int, int]
    op: int

    @property
    def question(self) -> str:
        chains = [ENTITIES[s] + "".join(LINKS[r] for r in p) + ATTRS[a]
                  for s, p, a in zip(self.starts, self.paths, self.attr)]
        return f"<q>{chains[0]};{chains[1]}{OPS[self.op]}</q>"

    def chain_entities(self, k: int) -> list[int]:
        """Entity indices visited by chain ``k``: its start, then one per link hop."""
        out = [self.starts[k]]
        for r in self.paths[k]:
            out.append(self.links[out[-1]][r])
        return out

    def values(self) -> tuple[int, int]:
        """The two retrieved attribute values."""
        return tuple(self.attrs[self.chain_entities(k)[-1]][self.attr[k]]  # type: ignore
                     for k in (0, 1))

    @property
    def answer(self) -> int:
        a, b = self.values()
        return max(a, b) if self.op == 0 else min(a, b)

    @property
    def num_turns(self) -> int:
        """Agent turns of the reference solution (calls + the answer)."""
        return len(self.paths[0]) + len(self.paths[1]) + 3


def make_problems(seed: int, n: int, min_hops: int = MIN_HOPS, max_hops: int = MAX_HOPS
                  ) -> list[Problem]:
    """``n`` random problems, deterministic from ``seed``: a fresh graph per problem (no link
    points back to its own entity), hop counts uniform in [min_hops, max_hops] per chain."""
    rng = np.random.default_rng(seed)
    ne, nl = len(ENTITIES), len(LINKS)
    out = []
    for _ in range(n):
        off = rng.integers(1, ne, size=(ne, nl))               # no self-loops
        links = (np.arange(ne)[:, None] + off) % ne
        attrs = rng.integers(VALUE_RANGE[0], VALUE_RANGE[1] + 1, size=(ne, len(ATTRS)))
        starts = rng.integers(0, ne, size=2)
        hops = rng.integers(min_hops, max_hops + 1, size=2)
        paths = tuple(tuple(int(r) for r in rng.integers(0, nl, size=int(h))) for h in hops)
        attr = rng.integers(0, len(ATTRS), size=2)
        op = int(rng.integers(0, len(OPS)))
        out.append(Problem(tuple(tuple(int(v) for v in row) for row in links),
                           tuple(tuple(int(v) for v in row) for row in attrs),
                           (int(starts[0]), int(starts[1])), paths,  # type: ignore[arg-type]
                           (int(attr[0]), int(attr[1])), op))
    return out


def lookup(problem: Problem, payload: str) -> str:
    """The tool: ``payload`` is the text between ``<call>`` and ``</call>``; exactly one entity
    and one relation (link or attribute), in either order. Returns ``<res>E</res>`` (a link),
    ``<res>7</res>`` (an attribute) or ``<res><err></res>``. Counts the call."""
    TOOL_CALLS.calls += 1
    if len(payload) != 2:
        return ERR_REPLY
    ent = [ch for ch in payload if ch in ENTITIES]
    rel = [ch for ch in payload if ch in LINKS or ch in ATTRS]
    if len(ent) != 1 or len(rel) != 1:
        return ERR_REPLY
    e, r = ENTITIES.index(ent[0]), rel[0]
    if r in LINKS:
        return f"<res>{ENTITIES[problem.links[e][LINKS.index(r)]]}</res>"
    return f"<res>{problem.attrs[e][ATTRS.index(r)]}</res>"


def call_text(entity: int, relation: str, relation_first: bool) -> str:
    """One call action in either form: ``<call>Ea</call>`` or ``<call>aE</call>``."""
    e = ENTITIES[entity]
    return f"<call>{relation + e if relation_first else e + relation}</call>"


def solved_messages(p: Problem, rng: np.random.Generator | None = None) -> list[dict]:
    """A reference (optimal) chat: user, then assistant/tool alternating, chain 1 then chain 2.
    Each call's argument order is drawn 50/50 from ``rng`` (entity first when ``rng`` is None)."""
    msgs = [{"role": "user", "content": p.question}]
    for k in (0, 1):
        ents = p.chain_entities(k)
        rels = [LINKS[r] for r in p.paths[k]] + [ATTRS[p.attr[k]]]
        for e, r in zip(ents, rels):
            rf = bool(rng.integers(0, 2)) if rng is not None else False
            act = call_text(e, r, rf)
            msgs.append({"role": "assistant", "content": act})
            msgs.append({"role": "tool", "content": lookup(p, act[6:-7])})
    msgs.append({"role": "assistant", "content": answer_text(p)})
    return msgs


def answer_text(p: Problem) -> str:
    """The reference answer action: ``<ans>{v1}{op}{v2}={result}</ans>``."""
    v1, v2 = p.values()
    return f"<ans>{v1}{OPS[p.op]}{v2}={p.answer}</ans>"


def answer_ok(p: Problem, payload: str) -> bool:
    """Whether an answer payload is the worked step with the right values (either order),
    combiner and result: ``7<max>3=7`` or ``3<max>7=7``."""
    v1, v2 = p.values()
    op = OPS[p.op]
    return payload in (f"{v1}{op}{v2}={p.answer}", f"{v2}{op}{v1}={p.answer}")


def messages_to_tokens(messages: Sequence[dict]) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokens and agent-turn spans (end exclusive) of a chat, without a tokenizer object."""
    return common.messages_to_tokens(messages, encode)


def tokens_to_messages(tokens: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[dict]:
    """Inverse of :func:`messages_to_tokens` for this task's chats: the text before the first
    span is the user message, spans are assistant turns, text between spans tool replies."""
    msgs = [{"role": "user", "content": decode(tokens[:spans[0][0]] if spans else tokens)}]
    for j, (a, e) in enumerate(spans):
        msgs.append({"role": "assistant", "content": decode(tokens[a:e])})
        nxt = spans[j + 1][0] if j + 1 < len(spans) else len(tokens)
        if nxt > e:
            msgs.append({"role": "tool", "content": decode(tokens[e:nxt])})
    return msgs


def parse_action(ids: Sequence[int]) -> tuple[str, str]:
    """Generated action tokens -> (kind, payload); kind is "call", "ans" or "bad"."""
    return common.parse_action(decode(ids), "call")


def run_episodes(problems: Sequence[Problem], generate_fn: GenerateFn,
                 max_turns: int = MAX_TURNS, tool_delay_s: float = 0.0
                 ) -> list[EpisodeResult]:
    """Runs the task with an agent and the ``lookup`` tool, all problems batched per turn.

    An episode ends at an ``<ans>`` action (success iff :func:`answer_ok`),
    at a malformed action, or after ``max_turns`` agent turns (failure). A malformed *call*
    (``<call>..</call>`` the tool rejects) is answered ``<res><err></res>`` and the episode goes
    on, so the agent sees a state the reference solution never shows.
    """
    return common.run_episodes(
        problems, generate_fn, max_turns, encode_fn=encode, decode_fn=decode,
        parse_fn=parse_action, tool_kind="call", tool=lookup, answer_ok=answer_ok,
        tool_delay_s=tool_delay_s)


def replay(problem: Problem, messages: Sequence[dict]) -> tuple[bool, bool]:
    """Replays a recorded chat's agent actions through the tool: returns (every recorded tool
    reply equals the tool's reply now, the episode succeeds)."""
    consistent, success = True, False
    for j, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        kind, payload = parse_action(encode(m["content"]))
        if kind == "call":
            reply = lookup(problem, payload)
            nxt = messages[j + 1] if j + 1 < len(messages) else None
            consistent &= nxt is not None and nxt["role"] == "tool" and nxt["content"] == reply
        else:
            success = kind == "ans" and answer_ok(problem, payload)
            consistent &= j == len(messages) - 1
    return consistent, success


def max_episode_tokens(max_hops: int = MAX_HOPS) -> int:
    """Upper bound on the tokens of a solved episode (for static shapes)."""
    q = 2 + 2 * (max_hops + 2) + 1 + 1
    link, attr, ans = 4 + 3, 4 + 3, MAX_ACTION_TOKENS
    return q + 2 * (max_hops * link + attr) + ans


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`VOCAB` with the task's chat template."""
    return common.build_tokenizer(TOKEN_ID, TASK_NAME)


def flax_generate_fn(model, *, batch: int = 64, context_len: int = 128,
                     max_new_tokens: int = 8, temperature: float = 0.0, key=None) -> GenerateFn:
    """Batched action generation with the Flax LM (:func:`prada_jax.lm.sampling.generate`) at
    static shapes [batch, context_len] tokens (longer contexts keep their last tokens; partial
    batches are padded with dummy rows); greedy when ``temperature`` is 0; stops at
    ``</call>`` or ``</ans>`` (:func:`prada_jax.lm.sampling.contexts_generate_fn`)."""
    return contexts_generate_fn(model, pad_id=PAD_ID, stop_ids=STOP_IDS, batch=batch,
                                   context_len=context_len, max_new_tokens=max_new_tokens,
                                   temperature=temperature, key=key)


def summarize(results: Sequence[EpisodeResult]) -> dict:
    """Success rate with its 95% Wilson interval, tool calls and mean agent turns."""
    k = sum(r.success for r in results)
    n = len(results)
    return {"success_rate": k / max(n, 1), "ci95": list(wilson_ci(k, n)), "n": n,
            "tool_calls": int(sum(r.tool_calls for r in results)),
            "mean_turns": float(np.mean([r.turns for r in results])) if n else 0.0}


def evaluate_model(model, problems: Sequence[Problem], batch: int = 64,
                   max_turns: int = MAX_TURNS) -> dict:
    """Runs the task with a Flax LM (greedy) and the tool: see :func:`summarize`."""
    return summarize(run_episodes(problems, flax_generate_fn(model, batch=batch), max_turns))


def num_valid_paths(p: Problem) -> int:
    """Distinct token sequences of a solved shortest episode of ``p`` (closed form): each of the
    h1 + h2 + 2 calls in either argument order, and the answer's two values in either order
    (one order when they are equal): ``2^(calls) * (2 if v1 != v2 else 1)``."""
    v1, v2 = p.values()
    return 2 ** (len(p.paths[0]) + len(p.paths[1]) + 2) * (2 if v1 != v2 else 1)


def valid_paths(p: Problem) -> list[tuple[int, ...]]:
    """Every solved shortest episode of ``p`` as token tuples, by enumeration (for tests and
    small problems: 2^calls × 2 sequences): each call form combination and answer order."""
    calls = []
    for k in (0, 1):
        ents = p.chain_entities(k)
        rels = [LINKS[r] for r in p.paths[k]] + [ATTRS[p.attr[k]]]
        calls += list(zip(ents, rels))
    v1, v2 = p.values()
    answers = {f"<ans>{a}{OPS[p.op]}{b}={p.answer}</ans>" for a, b in ((v1, v2), (v2, v1))}
    out = set()
    for forms in itertools.product((False, True), repeat=len(calls)):
        msgs = [{"role": "user", "content": p.question}]
        for (e, r), rf in zip(calls, forms):
            act = call_text(e, r, rf)
            msgs += [{"role": "assistant", "content": act},
                     {"role": "tool", "content": lookup(p, act[6:-7])}]
        for ans in answers:
            out.add(tuple(messages_to_tokens(msgs + [{"role": "assistant",
                                                      "content": ans}])[0]))
    return sorted(out)


def path_stats(pool, problems: Sequence[Problem]) -> dict:
    """How unique the pool's solution paths are (issue 35, item 4): for a pool recorded on
    ``problems`` (trajectory i on problem i), the share of trajectories token-equal to the
    reference chain (:func:`solved_messages` with entity-first calls), the share that are *a*
    solved shortest path (any call forms and answer order), the share that succeed, the mean
    number of distinct valid paths per problem (:func:`num_valid_paths`), and the share of the
    pool's successful trajectories that use both call forms. Pure counting, no tool calls
    counted (the tool counter is restored)."""
    n = min(pool.num_trajectories, len(problems))
    calls0 = TOOL_CALLS.calls
    eq_ref = eq_valid = succ = mixed = 0
    for i in range(n):
        p, toks = problems[i], tuple(int(t) for t in pool.trajectory(i))
        ref = tuple(messages_to_tokens(solved_messages(p))[0])
        eq_ref += toks == ref
        ok = bool(pool.success[i])
        succ += ok
        if ok:
            msgs = tokens_to_messages(list(toks), _spans(pool, i))
            forms = {m["content"][6] in ENTITIES for m in msgs   # entity first?
                     if m["role"] == "assistant" and m["content"].startswith("<call>")
                     and len(m["content"]) == len("<call>Kc</call>")}
            mixed += len(forms) == 2
            v1, v2 = p.values()
            eq_valid += (len(msgs) == 2 * (len(p.paths[0]) + len(p.paths[1]) + 2) + 2
                         and replay(p, msgs) == (True, True))
    TOOL_CALLS.calls = calls0
    return {"trajectories": n, "share_equal_reference": eq_ref / max(n, 1),
            "share_valid_shortest_path": eq_valid / max(n, 1), "success": succ / max(n, 1),
            "share_successful_mixing_forms": mixed / max(succ, 1),
            "valid_paths_per_problem_mean": float(np.mean([num_valid_paths(p)
                                                           for p in problems[:n]])),
            "valid_paths_per_problem_min": int(min(num_valid_paths(p) for p in problems[:n]))}


def _spans(pool, i: int) -> list[tuple[int, int]]:
    """Agent-turn spans of pool trajectory ``i``, relative to its first token."""
    a, b = int(pool.turn_offsets[i]), int(pool.turn_offsets[i + 1])
    base = int(pool.traj_offsets[i])
    return [(int(s) - base, int(e) - base) for s, e in zip(pool.turn_starts[a:b],
                                                          pool.turn_ends[a:b])]
