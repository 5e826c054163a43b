"""PRM scorers on tiny random models: one-pass prefix scores vs separate passes and vs an
independent transformers/NumPy reference; loading errors."""
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from prada_jax.traces import prm as prm_lib  # noqa: E402
from tests.helpers.hf_traces import make_step_tag_prm, make_tokenizer, make_value_head_prm  # noqa: E402

QUESTION = "Tom has 3 apples and buys 4 more. How many apples?"
STEPS = ["Step 1: add 3 and 4", "that is 7 apples", "so the answer is 7"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("prm")
    make_tokenizer(root / "tok")
    make_value_head_prm(root / "vh", tokenizer_dir=root / "tok")
    make_step_tag_prm(root / "tag", tokenizer_dir=root / "tok")
    return root


def test_value_head_one_pass_equals_separate_prefixes(folders):
    prm = prm_lib.load_prm(folders / "vh", "value-head", max_batch=8)
    whole = prm.score([QUESTION], [STEPS])[0]
    assert whole.shape == (len(STEPS) + 1,)
    separate = [prm.score([QUESTION], [STEPS[:j]])[0][-1] for j in range(len(STEPS) + 1)]
    np.testing.assert_allclose(whole, separate, rtol=0, atol=1e-6)
    # Batched with sequences of other lengths (right padding) gives the same numbers.
    batched = prm.score([QUESTION, "short?", QUESTION], [STEPS, [], STEPS[:1]])
    np.testing.assert_allclose(batched[0], whole, atol=1e-6)
    np.testing.assert_allclose(batched[2], whole[:2], atol=1e-6)


def test_value_head_matches_transformers_reference(folders):
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prm = prm_lib.load_prm(folders / "vh", "value-head")
    got = prm.score([QUESTION], [STEPS])[0]
    # Reference: the full causal LM's last hidden state (post final norm) at each "\n" that
    # follows the question or a step, a NumPy sigmoid of the stored head.
    tok = AutoTokenizer.from_pretrained(str(folders / "vh"))
    lm = AutoModelForCausalLM.from_pretrained(str(folders / "vh")).eval()
    nl = tok("\n", add_special_tokens=False)["input_ids"]
    assert len(nl) == 1
    ids = tok(QUESTION, add_special_tokens=True)["input_ids"] + nl
    for s in STEPS:
        ids += tok(s, add_special_tokens=False)["input_ids"] + nl
    positions = [i for i, t in enumerate(ids) if t == nl[0]]
    with torch.no_grad():
        hs = lm(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].numpy()
    head = load_file(str(folders / "vh" / "value_head.safetensors"))
    z = hs[positions] @ head["weight"][0].astype(np.float64) + head["bias"][0]
    np.testing.assert_allclose(got, 1.0 / (1.0 + np.exp(-z)), rtol=0, atol=1e-5)


def test_step_tag_matches_reference_and_prefixes(folders):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prm = prm_lib.load_prm(folders / "tag", "step-tag")
    got = prm.score([QUESTION], [STEPS])[0]
    tok = AutoTokenizer.from_pretrained(str(folders / "tag"))
    lm = AutoModelForCausalLM.from_pretrained(str(folders / "tag")).eval()
    enc = lambda s, sp=False: tok(s, add_special_tokens=sp)["input_ids"]  # noqa: E731
    tag = enc(" ки")
    ids = enc(QUESTION + " ", True) + tag
    ends = [len(ids) - 1]
    for s in STEPS:
        ids += enc(s) + tag
        ends.append(len(ids) - 1)
    with torch.no_grad():
        logits = lm(torch.tensor([ids])).logits[0].double().numpy()
    plus, minus = enc("+")[0], enc("-")[0]
    l = logits[ends][:, [plus, minus]]
    ref = np.exp(l[:, 0]) / np.exp(l).sum(-1)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    separate = [prm.score([QUESTION], [STEPS[:j]])[0][-1] for j in range(len(STEPS) + 1)]
    np.testing.assert_allclose(got, separate, atol=1e-6)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_value_head_is_an_error(folders, tmp_path):
    d = _copy(folders / "vh", tmp_path / "vh")
    (d / "value_head.safetensors").unlink()
    with pytest.raises(prm_lib.PRMError, match="value_head.safetensors.*missing"):
        prm_lib.load_prm(d, "value-head")


def test_misshapen_value_head_is_an_error(folders, tmp_path):
    from safetensors.torch import save_file

    d = _copy(folders / "vh", tmp_path / "vh")
    save_file({"weight": torch.zeros(1, 7), "bias": torch.zeros(1)},
              str(d / "value_head.safetensors"))
    with pytest.raises(prm_lib.PRMError, match="'weight' has shape"):
        prm_lib.load_prm(d, "value-head")


def test_missing_backbone_weights_is_an_error(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(folders / "vh", tmp_path / "vh")
    w = load_file(str(d / "model.safetensors"))
    w = {k: v for k, v in w.items() if "layers.1." not in k}
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(prm_lib.PRMError, match="weights missing"):
        prm_lib.load_prm(d, "value-head")


def test_style_mismatch_and_bad_config(folders, tmp_path):
    with pytest.raises(prm_lib.PRMError, match="--prm-style"):
        prm_lib.read_prm_config(folders / "vh", "step-tag")
    d = _copy(folders / "tag", tmp_path / "tag")
    cfg = json.loads((d / "prm_config.json").read_text())
    (d / "prm_config.json").write_text(json.dumps(dict(cfg, good_token="good+bad")))
    with pytest.raises(prm_lib.PRMError, match="good_token.*exactly one"):
        prm_lib.load_prm(d, "step-tag")
    (d / "prm_config.json").write_text(json.dumps(dict(cfg, colour="red")))
    with pytest.raises(prm_lib.PRMError, match="unknown field 'colour'"):
        prm_lib.read_prm_config(d)


def test_export_value_head_from_checkpoint_keys(folders, tmp_path):
    """A Skywork-style checkpoint keeps the head inside its weights: export it, then load."""
    from safetensors.torch import load_file, save_file

    d = _copy(folders / "vh", tmp_path / "sky")
    head = load_file(str(d / "value_head.safetensors"))
    (d / "value_head.safetensors").unlink()
    (d / "prm_config.json").unlink()
    w = load_file(str(d / "model.safetensors"))
    w["v_head.summary.weight"] = head["weight"].to(torch.bfloat16)
    w["v_head.summary.bias"] = head["bias"]
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    prm_lib.export_value_head(d)
    got = load_file(str(d / "value_head.safetensors"))
    np.testing.assert_array_equal(got["weight"].numpy(),
                                  head["weight"].to(torch.bfloat16).float().numpy())
    assert prm_lib.read_prm_config(d)["style"] == "value-head"
    prm_lib.load_prm(d)  # loads with the exported head
    empty = _copy(folders / "tag", tmp_path / "nohead")
    with pytest.raises(prm_lib.PRMError, match="v_head.summary.weight"):
        prm_lib.export_value_head(empty)
