"""The trace builder on a real model (marker ``real``): SmolLM2-135M-Instruct as the SLM, the
same model standing in for the LLM, and read as a step-tag PRM (roles labelled in meta.json),
on two problems of the embedded set. The root draft is checked against ``transformers``'
own greedy ``generate`` on the same chat-template prompt, and the root's context length
against the tokenizer. Skipped unless ``make real-model`` installed the model."""
import argparse
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from prada_jax.traces import format as fmt  # noqa: E402
from prada_jax.traces.builder import cli as cli_lib  # noqa: E402
from prada_jax.traces.builder.settings import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from tests.helpers.real_model import real_model_dir  # noqa: E402

pytestmark = pytest.mark.real

DATA = Path(__file__).resolve().parents[4] / "prada_jax" / "traces" / "data" / \
    "word_arith12.jsonl"
STEP_TOKENS = 8


def test_build_on_smollm2(tmp_path):
    model = real_model_dir()
    prm = tmp_path / "smol-as-prm"
    prm.mkdir()
    for f in model.iterdir():
        os.symlink(f, prm / f.name)
    (prm / "prm_config.json").write_text(json.dumps(
        {"style": "step-tag", "step_tag": "\nCorrect so far? Answer + or -:",
         "good_token": " +", "bad_token": " -", "question_template": "{question}\n"}))
    out = tmp_path / "traces"
    notes = {"llm": "stand-in: the SLM itself", "prm": "stand-in: SmolLM2 read as a step tag"}
    parser = argparse.ArgumentParser()
    cli_lib.add_arguments(parser)
    args = parser.parse_args([
        "--slm", str(model), "--llm", str(model), "--prm", str(prm), "--data", str(DATA),
        "--benchmark", "gsm8k", "--out", str(out), "--limit", "2", "--node-budget", "2",
        "--full-depth", "0", "--max-steps", "2", "--max-step-tokens", str(STEP_TOKENS),
        "--batch-size", "2", "--feature-dim", "8", "--device", "cpu", "--no-progress",
        "--role-notes", json.dumps(notes)])
    assert cli_lib.run(args) == 0
    meta = fmt.validate(out)
    assert meta["synthetic"] is False and meta["roles"]["prm"]["note"] == notes["prm"]
    traces = fmt.load(out)
    assert traces.num_problems == 2 and traces.num_nodes >= 2
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    question = json.loads(DATA.read_text().splitlines()[0])["question"]

    tok = transformers.AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(
        str(model), dtype=torch.float32, local_files_only=True).eval()
    prompt = tok.apply_chat_template([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                      {"role": "user", "content": question}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert int(traces.ctx_tokens[traces.root[0]]) == ids.shape[1]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        ref = tmodel.generate(ids, generation_config=transformers.GenerationConfig(
            do_sample=False, max_new_tokens=STEP_TOKENS, eos_token_id=eos,
            pad_token_id=eos))[0, ids.shape[1]:].tolist()
    text = tok.decode([t for t in ref if t != eos])
    if "\n\n" in text:
        text = text[:text.index("\n\n") + 2]
    root = steps[int(traces.root[0])]
    assert root["slm"] == text
    assert root["llm"] == root["slm"]   # greedy, same model: the stand-in LLM adds nothing
