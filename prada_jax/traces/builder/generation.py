"""One reasoning step per prefix from a Hugging Face causal LM, batched (the SLM drafts and
the LLM steps of a build)."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from prada_jax.traces.builder.settings import BuildError, Settings

__all__ = ["Step", "StepGenerator", "HFStepGenerator"]


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
        import torch  # lazy: torch is optional (the [torch] extra)
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: loads torch

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
        import torch  # lazy: torch is optional (the [torch] extra)

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
