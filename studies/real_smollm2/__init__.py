"""A real model through the real paths: SmolLM2-135M-Instruct (``make real-model``) as the edge
SLM of the trace builder and as the teacher of a distillation smoke (issue 45). Not a study
with a verdict: a record that the paths run on real weights, with their token counts, timings
and the student's KL curve. ``run.sh`` is the command; this module holds the steps that are
not already a project command (``python -m studies.real_smollm2 --step=... --workdir=DIR``):

* ``prm``: ``<workdir>/SmolLM2-135M-Instruct-as-PRM``, the converted model's files linked
  beside a ``prm_config.json`` that reads it as a Math-Shepherd-style step-tag PRM (after each
  step the question "Is the solution correct so far? Answer + or -:" and P(" +") against
  P(" -")). SmolLM2 was never trained as a PRM: the trace set labels this role a stand-in.
* ``chats``: a multi-turn task rendered with the real chat template: ``--n`` three-turn
  arithmetic conversations (a sum, then "multiply that by c", then "subtract d"), every
  assistant turn generated greedily by the teacher (PyTorch, ≤ 40 new tokens, stop at
  ``<|im_end|>``); ``success`` = the last number of the last answer is the true result. Writes
  ``chats.jsonl`` for ``python -m prada_jax.distill.pool convert``.
* ``student``: a 4-layer student with the teacher's tokenizer: the teacher's embedding, final
  norm and its decoder layers 0, 10, 20 and 29 (evenly spaced, first and last kept), saved as
  an HF folder for ``--config.student.init`` (a layer-dropped start, so the KL starts finite
  and the curve shows the offline distillation path learning; not a claim about students).
* ``heldout``: the same forward KL of the start and the final student on a second pool of
  teacher chats (``--seed=1``) that training never saw → ``results/heldout_kl.json``.
* ``curve``: ``distill/kl`` by update from the run's TensorBoard events → ``kl_curve.json`` and
  ``kl_curve.png`` in ``results/``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

import jax.numpy as jnp
import matplotlib
import numpy as np
from absl import flags
from flax import nnx
from safetensors.numpy import load_file, save_file

from prada_jax import cli
from prada_jax.distill.logits_store import TeacherLogits
from prada_jax.distill.losses import forward_kl_topk
from prada_jax.distill.pool import load_pool
from prada_jax.errors import BadInput
from prada_jax.lm.hf import load_hf

HERE = Path(__file__).resolve().parent
MODEL = "SmolLM2-135M-Instruct"
PRM_CONFIG = {"style": "step-tag", "question_template": "Question: {question}\nSolution:\n",
              "step_tag": "\nIs the solution correct so far? Answer + or -:",
              "good_token": " +", "bad_token": " -"}
STUDENT_LAYERS = (0, 10, 20, 29)
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "generation_config.json")


def make_prm_folder(model_dir: Path, out: Path) -> Path:
    """The step-tag PRM stand-in folder (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        link = out / name
        if not link.exists():
            os.symlink((model_dir / name).resolve(), link)
    (out / "prm_config.json").write_text(json.dumps(PRM_CONFIG, indent=1) + "\n")
    return out


def _problems(n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    return [tuple(int(x) for x in (rng.integers(2, 30), rng.integers(2, 30),
                                   rng.integers(2, 6), rng.integers(1, 20))) for _ in range(n)]


def _last_number(text: str) -> int | None:
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    return int(nums[-1]) if nums else None


def teacher_chats(model_dir: Path, out: Path, n: int, seed: int = 0,
                  max_new_tokens: int = 40) -> dict:
    """``chats.jsonl`` of ``n`` three-turn conversations answered by the teacher (docstring)."""
    import torch  # lazy: torch is the [torch] extra
    import transformers  # lazy: loads torch; after main's cli.hub_offline() (read at import)

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True).eval()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    probs = _problems(n, seed)
    chats = [[{"role": "user", "content": f"What is {a} plus {b}?"}] for a, b, _, _ in probs]
    follow = [lambda p: f"Now multiply that by {p[2]}.", lambda p: f"Subtract {p[3]} from that."]
    gen_cfg = transformers.GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                            eos_token_id=eos, pad_token_id=eos)
    tok.padding_side = "left"
    new_tokens = 0
    for turn in range(3):
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                 for c in chats]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            outs = model.generate(**enc, generation_config=gen_cfg)[:, enc["input_ids"].shape[1]:]
        for c, o in zip(chats, outs.tolist()):
            o = o[:o.index(eos)] if eos in o else o
            new_tokens += len(o)
            c.append({"role": "assistant", "content": tok.decode(o).strip()})
        if turn < 2:
            for c, p in zip(chats, probs):
                c.append({"role": "user", "content": follow[turn](p)})
    solved = 0
    with open(out, "w") as f:
        for c, (a, b, m, d) in zip(chats, probs):
            ok = _last_number(c[-1]["content"]) == (a + b) * m - d
            solved += ok
            f.write(json.dumps({"messages": c, "success": int(ok),
                                "task": "smollm2_arith_chat"}) + "\n")
    return {"chats": n, "teacher_new_tokens": new_tokens, "teacher_success": solved / n}


def truncated_student(model_dir: Path, out: Path, layers: Sequence[int] = STUDENT_LAYERS) -> dict:
    """The layer-dropped student HF folder (module docstring)."""
    src = load_file(str(model_dir / "model.safetensors"))
    keep = {}
    for k, v in src.items():
        m = re.match(r"model\.layers\.(\d+)\.(.*)", k)
        if m is None:
            keep[k] = v
        elif int(m.group(1)) in layers:
            keep[f"model.layers.{list(layers).index(int(m.group(1)))}.{m.group(2)}"] = v
    out.mkdir(parents=True, exist_ok=True)
    save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["num_hidden_layers"] = len(layers)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(model_dir / name, out / name)
    return {"layers": list(layers), "parameters": int(sum(v.size for v in keep.values()))}


def kl_curve(run_dir: Path, out_dir: Path = HERE / "results") -> dict:
    """``distill/kl`` (and ``distill/loss``) by update from ``<run_dir>/tb``."""
    # lazy: tensorboard (the reader) is a [dev] extra; the trainer writes with tensorboardX
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if "distill/kl" not in acc.Tags()["scalars"]:
        raise BadInput(f"{run_dir / 'tb'}: no distill/kl curve")
    curve = {tag: [[int(e.step), float(e.value)] for e in acc.Scalars(tag)]
             for tag in ("distill/kl", "distill/loss") if tag in acc.Tags()["scalars"]}
    rec = {"run": run_dir.name, "tags_by_update": "mean over each log.every window",
           "curves": curve}
    (out_dir / "kl_curve.json").write_text(json.dumps(rec, indent=1) + "\n")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg") (a file, no display)
    steps, kl = zip(*curve["distill/kl"])
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(steps, kl, marker="o")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("forward KL to teacher (nats/token)")
    ax.set_title("4-layer student ← SmolLM2-135M-Instruct (offline, top-k+tail)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "kl_curve.png", dpi=110)
    plt.close(fig)
    return {"first": curve["distill/kl"][0], "last": curve["distill/kl"][-1]}


def heldout_kl(pool_dir: Path, logits_dir: Path, students: dict, out: Path,
               batch: int = 4) -> dict:
    """Forward KL (the training loss: teacher top-k + tail buckets) of each student to the
    teacher on the agent tokens of a pool none of them trained on, per student folder."""
    pool = load_pool(pool_dir)
    store = TeacherLogits.open(logits_dir, require_complete=True)
    offs = np.asarray(pool.traj_offsets)
    toks, amask = np.asarray(pool.tokens), np.asarray(pool.action_mask)
    n = len(offs) - 1
    L = int(np.diff(offs).max())
    k = store.top_k
    ids = np.zeros((n, L), np.int32)
    att = np.zeros((n, L), np.int32)
    tk_ids = np.zeros((n, L - 1, k), np.int32)
    tk_logp = np.zeros((n, L - 1, k), np.float32)
    tail = np.zeros((n, L - 1), np.float32)
    mask = np.zeros((n, L - 1), np.float32)
    for i in range(n):   # right-padded: a causal model's real positions ignore the padding
        s, e = int(offs[i]), int(offs[i + 1])
        ids[i, :e - s], att[i, :e - s] = toks[s:e], 1
        t = store.get(str(i))
        tk_ids[i, :e - s - 1], tk_logp[i, :e - s - 1] = t["topk_ids"], t["topk_logp"]
        tail[i, :e - s - 1] = t["tail_mass"]
        mask[i, :e - s - 1] = amask[s + 1:e]   # row j predicts token j + 1
    fwd = nnx.jit(lambda m, x, a: m(x, a))
    res = {"pool": pool_dir.name, "sequences": n, "agent_tokens": int(mask.sum()),
           "top_k": k, "kl_nats_per_token": {}}
    for name, d in students.items():
        model, _ = load_hf(d)
        tot = 0.0
        for b in range(0, n, batch):
            logits = fwd(model, jnp.asarray(ids[b:b + batch]), jnp.asarray(att[b:b + batch]))
            _, per_tok = forward_kl_topk(logits[:, :-1], jnp.asarray(tk_ids[b:b + batch]),
                                         jnp.asarray(tk_logp[b:b + batch]),
                                         jnp.asarray(tail[b:b + batch]),
                                         jnp.asarray(mask[b:b + batch]))
            tot += float(per_tok.sum())
        res["kl_nats_per_token"][name] = tot / float(mask.sum())
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


STEPS = ("prm", "chats", "student", "curve", "heldout")


def _define(fv) -> None:
    flags.DEFINE_enum("step", None, list(STEPS), "which step", flag_values=fv)
    flags.DEFINE_string("workdir", "checkpoints/real_smollm2", "the run folder", flag_values=fv)
    flags.DEFINE_integer("n", 48, "conversations (step chats)", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("seed", 0, "problem seed (step chats)", flag_values=fv)
    flags.DEFINE_string("name", "chats", "step chats writes <workdir>/<name>.jsonl",
                        flag_values=fv)
    flags.DEFINE_string("results", str(HERE / "results"), "steps curve and heldout write "
                        "their records here", flag_values=fv)


def main(argv: Sequence[str] | None = None) -> dict:
    fv = cli.parse_local(_define, argv, "studies.real_smollm2", __doc__)
    if fv.step is None:
        raise BadInput(f"--step is required ({', '.join(STEPS)})")
    cli.hub_offline()
    w = Path(fv.workdir)
    model_dir = w / MODEL
    if fv.step != "curve" and not (model_dir / "config.json").is_file():
        raise BadInput(f"--workdir={w}: no converted model at {model_dir} (run.sh converts it)")
    if fv.step == "prm":
        res = {"prm": str(make_prm_folder(model_dir, w / f"{MODEL}-as-PRM"))}
    elif fv.step == "chats":
        res = teacher_chats(model_dir, w / f"{fv.name}.jsonl", fv.n, fv.seed)
    elif fv.step == "student":
        res = truncated_student(model_dir, w / "student_init")
    elif fv.step == "heldout":
        res = heldout_kl(w / "pool_heldout", w / "logits_heldout",
                         {"start (layer-dropped)": w / "student_init",
                          "after 60 updates": w / "distill" / "student_hf"},
                         Path(fv.results) / "heldout_kl.json")
    else:
        res = kl_curve(w / "distill", Path(fv.results))
    print(json.dumps(res))
    return res
