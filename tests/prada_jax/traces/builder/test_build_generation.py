"""The batched step generator (left padding, KV cache) against a plain reference: one prompt
at a time, no padding, no cache, the full forward pass recomputed for every token."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from prada_jax.traces.builder import generation as generation_lib  # noqa: E402
from prada_jax.traces.builder import settings as settings_lib  # noqa: E402
from tests.helpers.hf_traces import make_lm, make_tokenizer  # noqa: E402


def _settings(**kw):
    base = dict(benchmark="gsm8k", node_budget=4, full_depth=1, max_steps=4, behaviour="prm",
                behaviour_llm_prob=0.3, behaviour_threshold=0.7, behaviour_temp=0.1,
                behaviour_eps=0.05, step_delimiter="\n\n", max_step_tokens=10, temperature=0.0,
                system_prompt=settings_lib.DEFAULT_SYSTEM_PROMPT, feature_dim=8, seed=0, batch_size=3,
                prm_style="value-head", device="cpu", dtype="fp32", check_timeout=1.0)
    base.update(kw)
    return settings_lib.Settings(**base)


def _reference_step(model, tok, text, max_tokens, delim, eos):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    gen, logps, hiddens = [], [], []
    for _ in range(max_tokens):
        with torch.no_grad():
            out = model(torch.tensor([ids + gen]), output_hidden_states=True)
        logp = torch.log_softmax(out.logits[0, -1].double(), -1)
        t = int(torch.argmax(logp))
        gen.append(t)
        logps.append(float(logp[t]))
        hiddens.append(out.hidden_states[-1][0, -1].double().numpy())
        if t in eos or delim in tok.decode(gen):
            break
    return gen, np.array(logps), np.mean(hiddens, axis=0), len(ids)


@pytest.mark.parametrize("arch,boost", [("qwen2", 4.0), ("llama", 1.0)])
def test_batched_generation_matches_unbatched_reference(tmp_path, arch, boost):
    torch.set_num_threads(1)
    make_tokenizer(tmp_path / "tok")
    make_lm(tmp_path / "m", arch, seed=5, delimiter_boost=boost, tokenizer_dir=tmp_path / "tok")
    if arch == "llama":  # a tokenizer without a pad token (as Llama ships) must work too
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
        tok.pad_token = None
        tok.save_pretrained(str(tmp_path / "m"))
        assert AutoTokenizer.from_pretrained(str(tmp_path / "m")).pad_token is None
    st = _settings()
    gen = generation_lib.HFStepGenerator(tmp_path / "m", st, want_hidden=True)
    questions = ["What is 15 minus 6?", "A box holds 12 eggs. How many eggs are in 5 boxes?",
                 "Half of 18?"]
    steps = [[], ["Step 1: add the numbers.\n\n"], ["x\n\n", "y\n\n"]]
    got = gen.generate(questions, steps, [0, 1, 2])
    for q, s, g in zip(questions, steps, got):
        text = gen.prompt(q) + "".join(s)
        toks, logps, hidden, n_ctx = _reference_step(gen.model, gen.tok, text,
                                                     st.max_step_tokens, "\n\n", gen.eos_ids)
        assert list(g.token_ids) == toks
        assert g.n_tokens == len(toks) and g.ctx_tokens == n_ctx
        np.testing.assert_allclose(g.logprobs, logps, atol=1e-4)
        np.testing.assert_allclose(g.hidden, hidden, atol=1e-4)
        want_text = gen.tok.decode([t for t in toks if t not in gen.eos_ids],
                                   skip_special_tokens=True)
        cut = want_text.find("\n\n")
        assert g.text == (want_text[:cut + 2] if cut >= 0 else want_text)
    assert gen.prompt("Q").startswith("<|im_start|>system\nPlease reason step by step")
