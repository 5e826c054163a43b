"""Real step traces from Hugging Face models (docs/design.md §2): ``python -m prada_jax.traces build``.

For every problem of a benchmark JSONL file the builder grows a tree of prefix states
``x_k`` (prompt + k steps). Expanding a node runs, for the same prefix, one step of the edge
SLM (the draft) and one step of the server LLM, and scores the prefix and both candidates with
the PRM; child 0 continues with the draft, child 1 with the LLM step.

Generation: one step per call, batched across problems (one node per problem per round),
greedy unless ``--temperature`` > 0; a step ends at ``--step-delimiter`` (default ``"\\n\\n"``),
at an end-of-sequence token, or after ``--max-step-tokens`` tokens. The prompt is the model's
chat template with a system text asking for step-by-step reasoning and a final ``\\boxed{}``
answer (the Qwen2.5-Math chain-of-thought prompt, ``--system-prompt``); a tokenizer without a
chat template gets ``"{system}\\n\\n{question}\\n\\n"``. A candidate is terminal when its step
holds a complete ``\\boxed{}``, ended with end-of-sequence, reaches ``--max-steps``, or
leaves no room for another ``--max-step-tokens`` step in a model's context window; its
``correct`` flag checks the whole solution's final answer (``prada_jax.traces.answers``).

Tree expansion (per problem, node budget ``--node-budget``): every node up to depth
``--full-depth`` first (breadth-first), then the pending nodes in order of their visit
probability under a behaviour policy, until the budget is spent. The behaviour policy sends a
step to the LLM with probability ``eps + (1 - 2 eps) · sigmoid((thr - PRM(draft)) / temp)``
(an RSD-like soft threshold, ``--behaviour prm``) or a constant (``--behaviour const``).
Fallbacks (successor used when the chosen non-terminal candidate was not expanded), in order:
the node's other, expanded child; else the node at depth k + 1 of the same problem with the
highest visit probability; else, if no node exists at depth k + 1, the builder expands the
behaviour-preferred candidate anyway ("completion" nodes, beyond the budget, at most one per
depth). Counts of both are in ``meta.json`` under ``generator``.

Features ``feat[F]`` (names in ``meta["feature_names"]``): the SLM's last-layer (post final
norm) hidden states at the positions that produced the draft's tokens, mean-pooled, times a
fixed seeded Gaussian projection [H, F - 5] / sqrt(H) (drawn once per trace set from
``--seed``, stored in ``projection.safetensors``), then the draft's mean and min token
log-prob (nats), mean next-token entropy (nats), the step index k and the SLM context length
in tokens.

Resumable: results are staged per batch of ``--batch-size`` problems in ``OUT/staging/`` (one
safetensors file per batch, written to a temporary name and renamed), so a crash or Ctrl-C
loses at most the batch in flight; rerunning the same command continues, and a staging folder
made with different settings is refused. The final set is assembled with
``prada_jax.traces.format.save`` and checked with ``validate``; ``OUT`` also gets
``problems.jsonl`` (question, reference answer, per ``answer_id``) and ``steps.jsonl`` (the
text of both candidates per node).

torch/transformers are imported inside functions only (the ``[torch]`` extra).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import heapq
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from prada_jax.traces import answers as answers_lib
from prada_jax.traces import datasets as datasets_lib
from prada_jax.errors import BadInput

DEFAULT_SYSTEM_PROMPT = ("Please reason step by step, and put your final answer within "
                         "\\boxed{}.")
STATS_FEATURES = ("logp_mean", "logp_min", "entropy_mean", "step_index", "ctx_tokens")
STAGING = "staging"
SETTINGS_FILE = "settings.json"
PROJECTION_FILE = "projection.safetensors"
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class BuildError(BadInput):
    """Bad input to the builder: the message names the flag, file or field."""


# ---------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Registers the flags of the ``build`` subcommand on ``parser``."""
    g = parser.add_argument_group("models and data")
    g.add_argument("--slm", required=True, help="local HF folder of the edge SLM (drafts)")
    g.add_argument("--llm", required=True, help="local HF folder of the server LLM")
    g.add_argument("--prm", required=True, help="local HF folder of the PRM (+ prm_config.json)")
    g.add_argument("--prm-style", choices=("value-head", "step-tag"), default=None,
                   help="PRM kind; default: the 'style' in the PRM's prm_config.json")
    g.add_argument("--data", required=True, help="benchmark JSONL file (see docs/build_traces.md)")
    g.add_argument("--benchmark", required=True, choices=datasets_lib.BENCHMARKS)
    g.add_argument("--out", required=True, help="output trace folder (staging inside it)")
    g.add_argument("--limit", type=int, default=None, help="first N problems only")
    t = parser.add_argument_group("tree")
    t.add_argument("--node-budget", type=int, default=24, help="nodes per problem (>= 1)")
    t.add_argument("--full-depth", type=int, default=2,
                   help="expand every node up to this depth before budgeted expansion")
    t.add_argument("--max-steps", type=int, default=16,
                   help="steps per solution; candidates at this step are terminal")
    t.add_argument("--behaviour", choices=("prm", "const"), default="prm",
                   help="behaviour policy that orders expansion beyond --full-depth")
    t.add_argument("--behaviour-llm-prob", type=float, default=0.3,
                   help="const policy: probability of taking the LLM step")
    t.add_argument("--behaviour-threshold", type=float, default=0.7,
                   help="prm policy: PRM score of the draft at which P(LLM) = 1/2")
    t.add_argument("--behaviour-temp", type=float, default=0.1, help="prm policy: temperature")
    t.add_argument("--behaviour-eps", type=float, default=0.05,
                   help="prm policy: P(LLM) stays in [eps, 1 - eps]")
    s = parser.add_argument_group("generation")
    s.add_argument("--step-delimiter", default="\n\n",
                   help="text that ends a step (escapes like \\n are decoded)")
    s.add_argument("--max-step-tokens", type=int, default=256, help="tokens per step at most")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--system-prompt", default=DEFAULT_SYSTEM_PROMPT)
    s.add_argument("--feature-dim", type=int, default=16,
                   help=f"F: projected hidden dims + {len(STATS_FEATURES)} statistics")
    s.add_argument("--seed", type=int, default=0, help="projection and sampling seed")
    r = parser.add_argument_group("runtime")
    r.add_argument("--batch-size", type=int, default=8, help="problems per batch (staging unit)")
    r.add_argument("--prm-batch-size", type=int, default=16, help="sequences per PRM pass")
    r.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    r.add_argument("--dtype", choices=("bf16", "fp32", "fp16"), default=None,
                   help="model dtype (default: bf16 on cuda, fp32 on cpu)")
    r.add_argument("--check-timeout", type=float, default=answers_lib.DEFAULT_TIMEOUT_S,
                   help="seconds per answer check")
    r.add_argument("--max-batches", type=int, default=None,
                   help="stop after this many new batches (rerun to continue)")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest for tiny "
                        "models on a busy machine)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")


def _decode_escapes(s: str) -> str:
    return s.encode("utf-8").decode("unicode_escape") if "\\" in s else s


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that determines the content of a trace set (the resume fingerprint)."""
    benchmark: str
    node_budget: int
    full_depth: int
    max_steps: int
    behaviour: str
    behaviour_llm_prob: float
    behaviour_threshold: float
    behaviour_temp: float
    behaviour_eps: float
    step_delimiter: str
    max_step_tokens: int
    temperature: float
    system_prompt: str
    feature_dim: int
    seed: int
    batch_size: int
    prm_style: str
    device: str
    dtype: str
    check_timeout: float


def settings_from_args(args: argparse.Namespace, prm_style: str, device: str, dtype: str
                       ) -> Settings:
    """Validates the numeric flags; raises ``BuildError`` naming the flag."""
    def positive(name, v):
        if v is None or v < 1:
            raise BuildError(f"--{name.replace('_', '-')} must be >= 1, got {v}")

    for name in ("node_budget", "max_steps", "max_step_tokens", "batch_size", "prm_batch_size"):
        positive(name, getattr(args, name))
    if args.full_depth < 0:
        raise BuildError(f"--full-depth must be >= 0, got {args.full_depth}")
    if args.feature_dim < len(STATS_FEATURES) + 1:
        raise BuildError(f"--feature-dim must be >= {len(STATS_FEATURES) + 1} "
                         f"({len(STATS_FEATURES)} statistics + at least one projected dim)")
    if args.limit is not None and args.limit < 1:
        raise BuildError(f"--limit must be >= 1, got {args.limit}")
    if args.max_batches is not None and args.max_batches < 1:
        raise BuildError(f"--max-batches must be >= 1, got {args.max_batches}")
    if not 0.0 <= args.behaviour_llm_prob <= 1.0:
        raise BuildError("--behaviour-llm-prob must lie in [0, 1]")
    if not 0.0 <= args.behaviour_eps <= 0.5:
        raise BuildError("--behaviour-eps must lie in [0, 0.5]")
    if args.behaviour_temp <= 0:
        raise BuildError("--behaviour-temp must be > 0")
    if args.temperature < 0:
        raise BuildError("--temperature must be >= 0")
    if args.check_timeout <= 0:
        raise BuildError("--check-timeout must be > 0")
    delim = _decode_escapes(args.step_delimiter)
    if not delim:
        raise BuildError("--step-delimiter must not be empty")
    return Settings(benchmark=args.benchmark, node_budget=args.node_budget,
                    full_depth=args.full_depth, max_steps=args.max_steps,
                    behaviour=args.behaviour, behaviour_llm_prob=args.behaviour_llm_prob,
                    behaviour_threshold=args.behaviour_threshold,
                    behaviour_temp=args.behaviour_temp, behaviour_eps=args.behaviour_eps,
                    step_delimiter=delim, max_step_tokens=args.max_step_tokens,
                    temperature=args.temperature, system_prompt=args.system_prompt,
                    feature_dim=args.feature_dim, seed=args.seed, batch_size=args.batch_size,
                    prm_style=prm_style, device=device, dtype=dtype,
                    check_timeout=args.check_timeout)


def local_model_dir(path: str, flag: str) -> Path:
    """A local Hugging Face model folder, or ``BuildError`` at once (no hub download)."""
    p = Path(path).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p
    if p.is_dir():
        raise BuildError(f"{flag}: '{path}' has no config.json (not a Hugging Face model folder)")
    raise BuildError(
        f"{flag}: '{path}' is not a local folder. Hub names are never downloaded here; fetch "
        f"it first (e.g. `huggingface-cli download {path} --local-dir models/{p.name}`) and "
        "pass the folder.")


# ---------------------------------------------------------------------------- generation

@dataclasses.dataclass
class Step:
    """One generated step.

    Attributes:
      text: decoded step, cut right after the delimiter (no end-of-sequence text).
      n_tokens: generated tokens (>= 1, the end-of-sequence token included).
      logprobs: [T] log-prob of each generated token (nats).
      entropies: [T] entropy of each next-token distribution (nats).
      hidden: [H] mean last-layer hidden state over the positions that produced the tokens
        (only for the SLM; None otherwise).
      eos: generation ended with an end-of-sequence token.
      ctx_tokens: tokens of the prefix this step was generated from.
      token_ids: the generated token ids (empty where a generator does not report them).
    """
    text: str
    n_tokens: int
    logprobs: np.ndarray
    entropies: np.ndarray
    hidden: np.ndarray | None
    eos: bool
    ctx_tokens: int
    token_ids: tuple[int, ...] = ()


class StepGenerator(Protocol):
    name: str

    def generate(self, questions: Sequence[str], steps: Sequence[Sequence[str]],
                 seeds: Sequence[int]) -> list[Step]:
        """One step for each prefix (question + previous steps); ``seeds`` per row."""
        ...


def _cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


class HFStepGenerator:
    """Batched one-step generation with a Hugging Face causal LM (left padding, KV cache)."""

    def __init__(self, path: Path, settings: Settings, want_hidden: bool):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = path.name
        self.settings = settings
        self.want_hidden = want_hidden
        self.device = settings.device
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:  # e.g. Llama tokenizers: pad with EOS (masked anyway)
            if self.tok.eos_token is None:
                raise BuildError(f"{path}: the tokenizer has neither a pad nor an EOS token")
            self.tok.pad_token = self.tok.eos_token
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype[settings.dtype], local_files_only=True,
            output_loading_info=True)
        if info.get("missing_keys"):
            raise BuildError(f"{path}: weights missing from the checkpoint: "
                             f"{list(info['missing_keys'])[:5]}")
        self.model = model.to(self.device).eval()
        self.base = getattr(self.model, self.model.base_model_prefix)
        self.head = self.model.get_output_embeddings()
        eos = set()
        for src in (self.tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None),
                    model.config.eos_token_id):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, (list, tuple)):
                eos.update(int(x) for x in src)
        self.eos_ids = eos
        self.pad_id = (self.tok.pad_token_id if self.tok.pad_token_id is not None
                       else (min(eos) if eos else 0))
        self.hidden_size = int(model.config.hidden_size)
        self.max_context = int(getattr(model.config, "max_position_embeddings", None) or 1 << 30)
        # transformers 5 renamed the forward argument past_key_values -> cache.
        params = inspect.signature(self.base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def prompt(self, question: str) -> str:
        msgs = [{"role": "system", "content": self.settings.system_prompt},
                {"role": "user", "content": question}]
        if getattr(self.tok, "chat_template", None):
            return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return f"{self.settings.system_prompt}\n\n{question}\n\n"

    def generate(self, questions, steps, seeds) -> list[Step]:
        import torch

        st = self.settings
        texts = [self.prompt(q) + "".join(s) for q, s in zip(questions, steps)]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].to(self.device)
        mask = enc["attention_mask"].to(self.device)
        ctx = mask.sum(-1).tolist()
        b = ids.shape[0]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds] if st.temperature > 0 \
            else None
        delim = st.step_delimiter
        window = max(4, len(self.tok(delim, add_special_tokens=False)["input_ids"]) + 2)
        out_tokens: list[list[int]] = [[] for _ in range(b)]
        logps: list[list[float]] = [[] for _ in range(b)]
        ents: list[list[float]] = [[] for _ in range(b)]
        hid_sum = [None] * b
        done = [False] * b
        eos_hit = [False] * b
        with torch.inference_mode():
            o = self.base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            past = _cache_of(o)
            h = o.last_hidden_state[:, -1]
            last_pos = pos[:, -1]
            for _ in range(st.max_step_tokens):
                logits = self.head(h).float()
                logp = torch.log_softmax(logits, dim=-1)
                # masked (-inf) logits: 0 · (-inf) would be nan, so floor log-probs first
                ent = -(logp.exp() * logp.clamp(min=-1e30)).sum(-1)
                if gens is None:
                    nxt = logp.argmax(-1)
                else:
                    probs = torch.softmax(logits / st.temperature, dim=-1).cpu()
                    nxt = torch.stack([torch.multinomial(probs[i], 1, generator=gens[i])[0]
                                       for i in range(b)]).to(self.device)
                nxt_l = nxt.tolist()
                lp_l = logp.gather(-1, nxt[:, None])[:, 0].tolist()
                ent_l = ent.tolist()
                hf = h.float().cpu().numpy() if self.want_hidden else None
                for i in range(b):
                    if done[i]:
                        continue
                    out_tokens[i].append(nxt_l[i])
                    logps[i].append(lp_l[i])
                    ents[i].append(ent_l[i])
                    if hf is not None:
                        hid_sum[i] = hf[i].astype(np.float64) if hid_sum[i] is None \
                            else hid_sum[i] + hf[i]
                    if nxt_l[i] in self.eos_ids:
                        done[i] = eos_hit[i] = True
                    elif delim in self.tok.decode(out_tokens[i][-window:]):
                        done[i] = True
                if all(done):
                    break
                feed = torch.tensor([self.pad_id if done[i] else nxt_l[i] for i in range(b)],
                                    device=self.device)
                mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype,
                                                   device=self.device)], dim=1)
                last_pos = last_pos + 1
                o = self.base(input_ids=feed[:, None], attention_mask=mask,
                              position_ids=last_pos[:, None], use_cache=True,
                              **{self._cache_kw: past})
                past = _cache_of(o)
                h = o.last_hidden_state[:, -1]
        result = []
        for i in range(b):
            toks = out_tokens[i][:-1] if eos_hit[i] else out_tokens[i]
            text = self.tok.decode(toks, skip_special_tokens=True)
            cut = text.find(delim)
            if cut >= 0:
                text = text[:cut + len(delim)]
            n = len(out_tokens[i])
            result.append(Step(
                text=text, n_tokens=n, logprobs=np.asarray(logps[i], np.float64),
                entropies=np.asarray(ents[i], np.float64),
                hidden=(hid_sum[i] / n).astype(np.float32) if hid_sum[i] is not None else None,
                eos=eos_hit[i], ctx_tokens=int(ctx[i]), token_ids=tuple(out_tokens[i])))
        return result


# ---------------------------------------------------------------------------- tree building

@dataclasses.dataclass
class _Node:
    depth: int
    steps: tuple[str, ...]
    prob: float
    parent: int
    branch: int
    feat: np.ndarray | None = None
    prm: float = 0.0
    cand_prm: tuple[float, float] = (0.0, 0.0)
    cand_tokens: tuple[int, int] = (1, 1)
    ctx_tokens: int = 1
    child: list[int] = dataclasses.field(default_factory=lambda: [-1, -1])
    terminal: tuple[int, int] = (0, 0)
    correct: tuple[int, int] = (0, 0)
    fallback: int = -1
    p_llm: float = 0.5
    texts: tuple[str, str] = ("", "")
    completion: bool = False


def behaviour_llm_prob(draft_prm: float, st: Settings) -> float:
    """P(the behaviour policy takes the LLM step) at a node (see the module docstring)."""
    if st.behaviour == "const":
        return st.behaviour_llm_prob
    z = (st.behaviour_threshold - draft_prm) / st.behaviour_temp
    sig = 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))
    return st.behaviour_eps + (1.0 - 2.0 * st.behaviour_eps) * sig


def make_projection(hidden_size: int, feature_dim: int, seed: int) -> np.ndarray:
    """Fixed seeded Gaussian projection [H, F - 5] / sqrt(H), float32."""
    rng = np.random.default_rng([seed, hidden_size, feature_dim, 0x7072])
    k = feature_dim - len(STATS_FEATURES)
    return (rng.standard_normal((hidden_size, k)) / math.sqrt(hidden_size)).astype(np.float32)


def node_features(draft: Step, depth: int, projection: np.ndarray) -> np.ndarray:
    """feat [F] float32 of a node from its SLM draft (see the module docstring)."""
    if draft.hidden is None:
        raise ValueError("the SLM draft carries no hidden state")
    proj = draft.hidden.astype(np.float32) @ projection
    stats = np.array([draft.logprobs.mean(), draft.logprobs.min(), draft.entropies.mean(),
                      depth, draft.ctx_tokens], np.float32)
    return np.concatenate([proj.astype(np.float32), stats])


def feature_names(feature_dim: int) -> list[str]:
    k = feature_dim - len(STATS_FEATURES)
    return [f"hidden_proj_{i}" for i in range(k)] + list(STATS_FEATURES)


@dataclasses.dataclass
class ProblemTree:
    problem: datasets_lib.Problem
    nodes: list[_Node]
    n_completion: int = 0
    n_fallback_other_branch: int = 0
    n_fallback_same_depth: int = 0
    max_prm_rescore_diff: float = 0.0


def _row_seed(seed: int, problem: int, node: int, role: int) -> int:
    h = hashlib.sha256(f"{seed}/{problem}/{node}/{role}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _expand(trees: list[ProblemTree], picks: list[tuple[int, _Node]], slm: StepGenerator,
            llm: StepGenerator, prm, st: Settings, projection: np.ndarray,
            stats: answers_lib.CheckStats) -> list[int]:
    """Expands one pending node per pick (batched); appends them; returns their node ids."""
    qs = [trees[t].problem.question for t, _ in picks]
    prev = [list(n.steps) for _, n in picks]
    ids = [len(trees[t].nodes) for t, _ in picks]
    pidx = [trees[t].problem.index for t, _ in picks]
    drafts = slm.generate(qs, prev, [_row_seed(st.seed, p, i, 0) for p, i in zip(pidx, ids)])
    llm_steps = llm.generate(qs, prev, [_row_seed(st.seed, p, i, 1) for p, i in zip(pidx, ids)])
    scores = prm.score(qs + qs, [s + [d.text] for s, d in zip(prev, drafts)]
                       + [s + [l.text] for s, l in zip(prev, llm_steps)])
    k = len(picks)
    context_limit = min(getattr(slm, "max_context", 1 << 30), getattr(llm, "max_context", 1 << 30))
    out = []
    for j, (t, node) in enumerate(picks):
        tree = trees[t]
        d = node.depth
        draft, lstep = drafts[j], llm_steps[j]
        sa, sb = scores[j], scores[k + j]
        node.prm = float(sa[d])
        if node.parent >= 0:
            # The same prefix was scored as the parent's candidate; keep one score (batched or
            # bf16 passes differ in the last bits) and record how far the rescoring was.
            parent_score = tree.nodes[node.parent].cand_prm[node.branch]
            tree.max_prm_rescore_diff = max(tree.max_prm_rescore_diff,
                                            abs(node.prm - parent_score))
            node.prm = parent_score
        node.cand_prm = (float(sa[d + 1]), float(sb[d + 1]))
        node.cand_tokens = (max(1, draft.n_tokens), max(1, lstep.n_tokens))
        node.ctx_tokens = max(1, draft.ctx_tokens)
        node.feat = node_features(draft, d, projection)
        node.texts = (draft.text, lstep.text)
        term, corr = [], []
        for cand in (draft, lstep):
            # "context full": the next step might not fit in a model's position range.
            full = max(g.ctx_tokens for g in (draft, lstep)) + cand.n_tokens \
                + st.max_step_tokens > context_limit
            is_term = (cand.eos or answers_lib.has_final_answer(cand.text)
                       or d + 1 >= st.max_steps or full)
            ok = False
            if is_term:
                ok = answers_lib.check_solution("".join(node.steps) + cand.text,
                                                tree.problem.answer, tree.problem.kind,
                                                st.check_timeout, stats)
            term.append(int(is_term))
            corr.append(int(ok))
        node.terminal, node.correct = tuple(term), tuple(corr)
        node.p_llm = behaviour_llm_prob(node.cand_prm[0], st)
        nid = len(tree.nodes)
        tree.nodes.append(node)
        if node.parent >= 0:
            tree.nodes[node.parent].child[node.branch] = nid
        out.append(nid)
    return out


def _children(node: _Node) -> list[_Node]:
    kids = []
    for c, p in ((0, 1.0 - node.p_llm), (1, node.p_llm)):
        if not node.terminal[c]:
            kids.append(_Node(depth=node.depth + 1, steps=node.steps + (node.texts[c],),
                              prob=node.prob * p, parent=-1, branch=c))
    return kids


def _needs_completion(tree: ProblemTree) -> int | None:
    """First node with an unexpanded non-terminal candidate, no expanded child and no node at
    the next depth (so no fallback exists), else None."""
    depths = {n.depth for n in tree.nodes}
    for i, n in enumerate(tree.nodes):
        open_ = [c for c in (0, 1) if not n.terminal[c] and n.child[c] < 0]
        if open_ and all(ch < 0 for ch in n.child) and (n.depth + 1) not in depths:
            return i
    return None


def _assign_fallbacks(tree: ProblemTree) -> None:
    best_at: dict[int, int] = {}
    for i, n in enumerate(tree.nodes):
        j = best_at.get(n.depth)
        if j is None or n.prob > tree.nodes[j].prob:
            best_at[n.depth] = i
    for n in tree.nodes:
        if not any(not n.terminal[c] and n.child[c] < 0 for c in (0, 1)):
            continue
        kids = [ch for ch in n.child if ch >= 0]
        if kids:
            n.fallback = kids[0]
            tree.n_fallback_other_branch += 1
        else:
            n.fallback = best_at[n.depth + 1]
            tree.n_fallback_same_depth += 1


def build_trees(problems: Sequence[datasets_lib.Problem], slm: StepGenerator, llm: StepGenerator,
                prm, st: Settings, projection: np.ndarray,
                stats: answers_lib.CheckStats | None = None) -> list[ProblemTree]:
    """Grows the step trees of a batch of problems (see the module docstring).

    Each round expands at most one node per problem, so a problem's tree does not depend on
    which other problems share its batch (up to the numerics of padded batched passes).
    """
    stats = stats if stats is not None else answers_lib.CheckStats()
    trees = [ProblemTree(p, []) for p in problems]
    queues: list[list] = []
    for _ in problems:
        root = _Node(depth=0, steps=(), prob=1.0, parent=-1, branch=-1)
        queues.append([((0, 0, 0.0), 0, root)])
    counters = [1] * len(problems)

    def key(n: _Node):
        if n.depth <= st.full_depth:
            return (0, n.depth, 0.0)
        return (1, 0, -n.prob)

    while True:
        picks = []
        for t, q in enumerate(queues):
            if q and len(trees[t].nodes) < st.node_budget:
                picks.append((t, heapq.heappop(q)[2]))
        if not picks:
            break
        new_ids = _expand(trees, picks, slm, llm, prm, st, projection, stats)
        for (t, _), nid in zip(picks, new_ids):
            for kid in _children(trees[t].nodes[nid]):
                kid.parent = nid
                heapq.heappush(queues[t], (key(kid), counters[t], kid))
                counters[t] += 1
    while True:  # completion nodes: only where a path would otherwise have no next node
        picks = []
        for t, tree in enumerate(trees):
            i = _needs_completion(tree)
            if i is None:
                continue
            n = tree.nodes[i]
            open_ = [c for c in (0, 1) if not n.terminal[c]]
            c = max(open_, key=lambda c: (n.p_llm if c == 1 else 1.0 - n.p_llm, -c))
            p = n.p_llm if c == 1 else 1.0 - n.p_llm
            kid = _Node(depth=n.depth + 1, steps=n.steps + (n.texts[c],), prob=n.prob * p,
                        parent=i, branch=c, completion=True)
            picks.append((t, kid))
            tree.n_completion += 1
        if not picks:
            break
        _expand(trees, picks, slm, llm, prm, st, projection, stats)
    for tree in trees:
        _assign_fallbacks(tree)
    return trees


# ---------------------------------------------------------------------------- staging

_ARRAY_FIELDS = ("feat", "prm", "cand_prm", "cand_tokens", "ctx_tokens", "child", "terminal",
                 "correct", "fallback", "depth")


def trees_to_arrays(trees: Sequence[ProblemTree]) -> dict[str, np.ndarray]:
    """Per-node arrays of a batch with problem-local node ids, plus ``n_nodes`` [P] and
    ``problem_index`` [P]."""
    nodes = [n for t in trees for n in t.nodes]
    return {
        "feat": np.stack([n.feat for n in nodes]).astype(np.float32),
        "prm": np.array([n.prm for n in nodes], np.float32),
        "cand_prm": np.array([n.cand_prm for n in nodes], np.float32),
        "cand_tokens": np.array([n.cand_tokens for n in nodes], np.int32),
        "ctx_tokens": np.array([n.ctx_tokens for n in nodes], np.int32),
        "child": np.array([n.child for n in nodes], np.int32),
        "terminal": np.array([n.terminal for n in nodes], np.uint8),
        "correct": np.array([n.correct for n in nodes], np.uint8),
        "fallback": np.array([n.fallback for n in nodes], np.int32),
        "depth": np.array([n.depth for n in nodes], np.int32),
        "completion": np.array([n.completion for n in nodes], np.uint8),
        "n_nodes": np.array([len(t.nodes) for t in trees], np.int32),
        "problem_index": np.array([t.problem.index for t in trees], np.int32),
    }


def _batch_name(start: int, end: int) -> str:
    return f"batch_{start:07d}_{end:07d}.safetensors"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_batch(staging: Path, start: int, end: int, trees: Sequence[ProblemTree],
                extra: dict) -> Path:
    """Writes one batch atomically (temporary file, fsync, rename)."""
    from safetensors.numpy import save

    arrays = trees_to_arrays(trees)
    texts = [[list(n.texts) for n in t.nodes] for t in trees]
    meta = {"texts": json.dumps(texts), "extra": json.dumps(extra)}
    path = staging / _batch_name(start, end)
    _atomic_write_bytes(path, save(arrays, metadata=meta))
    return path


def read_batch(path: Path) -> tuple[dict[str, np.ndarray], list, dict]:
    from safetensors import safe_open

    arrays = {}
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            arrays[k] = f.get_tensor(k)
    return arrays, json.loads(meta.get("texts", "[]")), json.loads(meta.get("extra", "{}"))


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_fingerprint(path: Path) -> dict:
    """Folder name, sha256 of config.json, and names + sizes of the weight files (weights are
    not hashed: multi-GB)."""
    weights = sorted([p.name, p.stat().st_size] for p in path.iterdir()
                     if p.suffix in (".safetensors", ".bin") or p.name.endswith(".index.json"))
    return {"name": path.name, "config_sha256": _file_sha256(path / "config.json"),
            "weights": weights}


def _diff_keys(a, b, prefix: str = "") -> list[str]:
    """Dotted names of the leaves where two JSON-like dicts differ."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [prefix.rstrip(".") or "<root>"] if a != b else []
    out = []
    for k in sorted(set(a) | set(b)):
        out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
    return out


def _prepare_staging(out: Path, fingerprint: dict) -> Path:
    staging = out / STAGING
    fingerprint = json.loads(json.dumps(fingerprint))  # compare as stored (tuples -> lists)
    staging.mkdir(parents=True, exist_ok=True)
    for p in staging.glob("*.tmp*"):  # leftovers of a write killed half-way
        p.unlink()
    sfile = staging / SETTINGS_FILE
    has_batches = any(staging.glob("batch_*.safetensors"))
    if sfile.is_file() and has_batches:
        from prada_jax.jsonio import read_json

        old = read_json(sfile, error=BuildError)
        if old != fingerprint:
            diff = _diff_keys(old, fingerprint)
            raise BuildError(f"{sfile}: the staged batches were built with different settings "
                             f"({', '.join(diff)}); use another --out or delete {staging}")
    else:  # nothing staged yet: (re)start with these settings and a fresh projection
        (staging / PROJECTION_FILE).unlink(missing_ok=True)
        _atomic_write_bytes(sfile, json.dumps(fingerprint, indent=2, sort_keys=True).encode())
    return staging


# ---------------------------------------------------------------------------- assembly

def assemble(out: Path, problems: Sequence[datasets_lib.Problem], batches: list[tuple[int, int]],
             meta: dict) -> dict:
    """Joins the staged batches into ``out`` (``format.save``), validates; returns the meta."""
    from prada_jax.traces import format as fmt

    staging = out / STAGING
    parts, texts_all, extras = [], [], []
    for start, end in batches:
        arrays, texts, extra = read_batch(staging / _batch_name(start, end))
        parts.append(arrays)
        texts_all += [pair for problem_texts in texts for pair in problem_texts]
        extras.append(extra)
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    n_nodes = cat["n_nodes"]
    roots = np.concatenate([[0], np.cumsum(n_nodes)[:-1]]).astype(np.int32)
    offset = np.repeat(roots, n_nodes)
    child = np.where(cat["child"] >= 0, cat["child"] + offset[:, None], -1).astype(np.int32)
    fallback = np.where(cat["fallback"] >= 0, cat["fallback"] + offset, -1).astype(np.int32)
    traces = fmt.TraceSet(
        feat=cat["feat"], prm=cat["prm"], cand_prm=cat["cand_prm"],
        cand_tokens=cat["cand_tokens"], ctx_tokens=cat["ctx_tokens"], child=child,
        terminal=cat["terminal"], correct=cat["correct"], fallback=fallback, depth=cat["depth"],
        problem=np.repeat(np.arange(len(n_nodes), dtype=np.int32), n_nodes), root=roots,
        n_nodes=n_nodes.astype(np.int32), answer_id=cat["problem_index"].astype(np.int32))
    fallback_uses = int((fallback >= 0).sum())
    gen = dict(meta.get("generator", {}))
    gen.update(
        completion_nodes=int(cat["completion"].sum()),
        nodes_with_fallback=fallback_uses,
        fallback_other_branch=int(sum(e.get("fallback_other_branch", 0) for e in extras)),
        fallback_same_depth=int(sum(e.get("fallback_same_depth", 0) for e in extras)),
        answer_checks=int(sum(e.get("checks", 0) for e in extras)),
        answer_check_timeouts=int(sum(e.get("timeouts", 0) for e in extras)),
        build_seconds=float(sum(e.get("seconds", 0.0) for e in extras)),
        max_prm_rescore_diff=float(max(e.get("max_prm_rescore_diff", 0.0) for e in extras)),
    )
    full_meta = dict(meta, generator=gen)
    fmt.save(traces, out, full_meta)
    with open(out / "problems.jsonl.tmp", "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"answer_id": p.index, "question": p.question,
                                "answer": p.answer, "kind": p.kind}) + "\n")
    os.replace(out / "problems.jsonl.tmp", out / "problems.jsonl")
    with open(out / "steps.jsonl.tmp", "w", encoding="utf-8") as f:
        for nid, (pair, dep) in enumerate(zip(texts_all, cat["depth"])):
            f.write(json.dumps({"node": nid, "depth": int(dep), "slm": pair[0],
                                "llm": pair[1]}) + "\n")
    os.replace(out / "steps.jsonl.tmp", out / "steps.jsonl")
    return fmt.validate(out)


# ---------------------------------------------------------------------------- run

def _resolve_device(device: str | None, dtype: str | None) -> tuple[str, str]:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
        raise BuildError(f"--device must be cuda or cpu, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BuildError("--device cuda: no CUDA device is available (use --device cpu)")
    if dtype is None:
        dtype = "bf16" if device.startswith("cuda") else "fp32"
    return device, dtype


def build(args: argparse.Namespace, *, slm: StepGenerator | None = None,
          llm: StepGenerator | None = None, prm=None) -> dict:
    """Builds (or resumes) a trace set from parsed flags; returns the final ``meta.json``,
    or ``{"incomplete": True, ...}`` when stopped early by ``--max-batches``.

    ``slm``/``llm``/``prm`` replace the models loaded from the flags (tests use scripted
    ones); the folders are still checked and fingerprinted.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from prada_jax.traces import prm as prm_lib

    if getattr(args, "no_progress", False):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    slm_dir = local_model_dir(args.slm, "--slm")
    llm_dir = local_model_dir(args.llm, "--llm")
    prm_dir = local_model_dir(args.prm, "--prm")
    try:
        prm_cfg = prm_lib.read_prm_config(prm_dir, args.prm_style)
    except prm_lib.PRMError as e:
        raise BuildError(str(e)) from None
    device, dtype = _resolve_device(args.device, args.dtype)
    st = settings_from_args(args, prm_cfg["style"], device, dtype)
    data = Path(args.data)
    try:
        problems = datasets_lib.load_problems(data, args.benchmark, args.limit)
    except datasets_lib.DatasetError as e:
        raise BuildError(f"--data: {e}") from None
    out = Path(args.out)
    fingerprint = {
        "settings": dataclasses.asdict(st),
        "models": {"slm": model_fingerprint(slm_dir), "llm": model_fingerprint(llm_dir),
                   "prm": model_fingerprint(prm_dir)},
        "prm_config": prm_cfg,
        "data_sha256": _file_sha256(data),
    }
    staging = _prepare_staging(out, fingerprint)
    b = st.batch_size
    batches = [(s, min(s + b, len(problems))) for s in range(0, len(problems), b)]
    todo = [(s, e) for s, e in batches if not (staging / _batch_name(s, e)).is_file()]
    if todo:
        import torch

        if args.threads is not None:
            if args.threads < 1:
                raise BuildError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        torch.manual_seed(st.seed)
        if slm is None:
            slm = HFStepGenerator(slm_dir, st, want_hidden=True)
        if llm is None:
            llm = HFStepGenerator(llm_dir, st, want_hidden=False)
        if prm is None:
            try:
                prm = prm_lib.load_prm(prm_dir, st.prm_style, device, dtype, args.prm_batch_size)
            except prm_lib.PRMError as e:
                raise BuildError(str(e)) from None
    proj_path = staging / PROJECTION_FILE
    if proj_path.is_file():
        from safetensors.numpy import load_file

        projection = load_file(str(proj_path))["projection"]
    else:
        from safetensors.numpy import save

        from prada_jax.jsonio import read_json

        hidden = getattr(slm, "hidden_size", None) or read_json(
            slm_dir / "config.json", error=BuildError).get("hidden_size")
        if not isinstance(hidden, int):
            raise BuildError(f"{slm_dir / 'config.json'}: field 'hidden_size' must be an integer")
        projection = make_projection(int(hidden), st.feature_dim, st.seed)
        _atomic_write_bytes(proj_path, save({"projection": projection}))
    bar = None
    if not getattr(args, "no_progress", False) and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(problems), initial=len(problems) - sum(e - s for s, e in todo),
                   unit="problem", desc=f"build {st.benchmark}", dynamic_ncols=True,
                   file=sys.stderr)
    done_now = 0
    try:
        for s, e in todo:
            if args.max_batches is not None and done_now >= args.max_batches:
                return {"incomplete": True, "batches_left": len(todo) - done_now}
            t0 = time.perf_counter()
            stats = answers_lib.CheckStats()
            trees = build_trees(problems[s:e], slm, llm, prm, st, projection, stats)
            extra = {"seconds": time.perf_counter() - t0, "checks": stats.checks,
                     "timeouts": stats.timeouts,
                     "fallback_other_branch": sum(t.n_fallback_other_branch for t in trees),
                     "fallback_same_depth": sum(t.n_fallback_same_depth for t in trees),
                     "max_prm_rescore_diff": max(t.max_prm_rescore_diff for t in trees)}
            write_batch(staging, s, e, trees, extra)
            done_now += 1
            if bar is not None:
                bar.update(e - s)
    finally:
        if bar is not None:
            bar.close()
    if proj_path.is_file():
        import shutil

        shutil.copyfile(proj_path, out / (PROJECTION_FILE + ".tmp"))
        os.replace(out / (PROJECTION_FILE + ".tmp"), out / PROJECTION_FILE)
    meta = {
        "benchmark": st.benchmark,
        "synthetic": False,
        "models": {"slm": slm_dir.name, "llm": llm_dir.name, "prm": prm_dir.name},
        "prm_style": st.prm_style,
        "feature_names": feature_names(st.feature_dim),
        "generator": {
            "kind": "hf_build",
            "data_file": data.name,
            "data_sha256": fingerprint["data_sha256"],
            "projection": "seeded gaussian [H, F-5] / sqrt(H), projection.safetensors",
            "answer_checker": {"rel_tol": answers_lib.REL_TOL,
                               "sympy": answers_lib.SYMPY_AVAILABLE},
            **{k: v for k, v in dataclasses.asdict(st).items() if k != "device"},
        },
    }
    return assemble(out, problems, batches, meta)


def run(args: argparse.Namespace) -> int:
    """Runs the ``build`` subcommand; returns the exit code (0 ok, 2 bad input, 130 Ctrl-C)."""
    try:
        meta = build(args)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished batches are kept in {Path(args.out) / STAGING}; rerun "
              "the same command to continue", file=sys.stderr)
        return EXIT_INTERRUPTED
    if meta.get("incomplete"):
        print(f"stopped after --max-batches; {meta['batches_left']} batch(es) left; rerun to "
              "continue", file=sys.stderr)
        return 0
    gen = meta["generator"]
    print(f"wrote {args.out}: {meta['counts']['problems']} problems, {meta['counts']['nodes']} "
          f"nodes, max depth {meta['max_depth']}, {gen['completion_nodes']} completion nodes, "
          f"{gen['nodes_with_fallback']} nodes with a fallback, build time "
          f"{gen['build_seconds']:.1f} s")
    return 0
