"""Tiny offline fixtures for the trace-builder tests (``from tests.helpers.hf_traces import ...``).

Randomly initialised Qwen2 / Llama causal LMs built from a config (vocab ~400, hidden 32,
2 layers), a byte-level BPE tokenizer trained here in well under a second, a value-head and a
step-tag PRM folder, and a few problems per benchmark schema. Nothing is downloaded.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "He has 3 + 4 = 7 apples.\n#### 7"},
    {"question": "A box holds 12 eggs. How many eggs are in 5 boxes?",
     "answer": "12 * 5 = 60\n#### 60"},
    {"question": "Sara read 1,200 pages in 4 days. Pages per day?",
     "answer": "1200 / 4 = 300\n#### 300"},
    {"question": "What is 15 minus 6?", "answer": "#### 9"},
    {"question": "Half of 18 is what number?", "answer": "#### 9"},
]


def _corpus():
    lines = [r["question"] for r in GSM8K_ROWS]
    lines += ["Step 1: add the numbers.\n\nStep 2: so the answer is \\boxed{7}.\n\n",
              "Please reason step by step, and put your final answer within \\boxed{}.",
              "system user assistant ки + - 0123456789 = * / ( ) \\frac{1}{2}"] * 20
    return lines


def make_tokenizer(out: Path, vocab_size: int = 400):
    """Byte-level BPE trained on a tiny corpus, with a chat template; saved to ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def make_lm(out: Path, arch: str = "qwen2", seed: int = 0, hidden: int = 32,
            delimiter_boost: float = 4.0, tokenizer_dir: Path | None = None):
    """A random tiny causal LM + tokenizer in ``out``; the "\\n\\n" row of the output head is
    scaled by ``delimiter_boost`` so random greedy steps sometimes end at the delimiter."""
    import torch
    from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir)) if tokenizer_dir
           else make_tokenizer(out))
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, tie_word_embeddings=False,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  bos_token_id=None)
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)  # larger activations: less degenerate text
        nl = tok("\n\n", add_special_tokens=False)["input_ids"]
        if len(nl) == 1:
            model.lm_head.weight[nl[0]].mul_(delimiter_boost)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return model, tok


def make_value_head_prm(out: Path, seed: int = 2, tokenizer_dir: Path | None = None,
                        separator: str = "\n"):
    """A tiny Qwen2 PRM folder with ``value_head.safetensors`` and ``prm_config.json``."""
    import torch
    from safetensors.torch import save_file

    model, tok = make_lm(out, "qwen2", seed=seed, tokenizer_dir=tokenizer_dir)
    g = torch.Generator().manual_seed(seed)
    h = model.config.hidden_size
    save_file({"weight": torch.randn(1, h, generator=g) * 0.5, "bias": torch.tensor([0.1])},
              str(out / "value_head.safetensors"))
    (out / "prm_config.json").write_text(json.dumps(
        {"style": "value-head", "step_separator": separator, "question_template": "{question}"}))
    return model, tok


def make_step_tag_prm(out: Path, seed: int = 3, tokenizer_dir: Path | None = None):
    """A tiny Llama PRM folder in the Math-Shepherd step-tag style."""
    model, tok = make_lm(out, "llama", seed=seed, tokenizer_dir=tokenizer_dir)
    (out / "prm_config.json").write_text(json.dumps(
        {"style": "step-tag", "step_tag": " ки", "good_token": "+", "bad_token": "-"}))
    return model, tok


def make_all(root: Path) -> dict[str, Path]:
    """SLM (Qwen2), LLM (Llama, a different seed and width), value-head PRM and step-tag PRM
    folders sharing one tokenizer, plus a gsm8k JSONL file. Returns their paths."""
    root.mkdir(parents=True, exist_ok=True)
    tok_dir = root / "tokenizer"
    make_tokenizer(tok_dir)
    paths = {"slm": root / "tiny-slm", "llm": root / "tiny-llm", "prm": root / "tiny-prm",
             "prm_tag": root / "tiny-prm-tag", "data": root / "gsm8k.jsonl"}
    make_lm(paths["slm"], "qwen2", seed=0, hidden=32, tokenizer_dir=tok_dir)
    make_lm(paths["llm"], "llama", seed=1, hidden=48, tokenizer_dir=tok_dir)
    make_value_head_prm(paths["prm"], tokenizer_dir=tok_dir)
    make_step_tag_prm(paths["prm_tag"], tokenizer_dir=tok_dir)
    paths["data"].write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    return paths
