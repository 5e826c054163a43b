"""Real step traces from Hugging Face models: ``python -m prada_jax.traces build`` (docs/build_traces.md).

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

Modules, one job each: ``cli`` (the subcommand's flags and exit codes), ``settings`` (the
validated settings that fix a trace set's content), ``generation`` (one step per prefix from a
Hugging Face causal LM), ``tree`` (growing the step trees of a batch of problems), ``staging``
(the resumable per-batch files in ``OUT/staging/``), ``assembly`` (joining the staged batches
into the trace set) and ``pipeline`` (one whole build run).

torch/transformers are imported inside functions only (the ``[torch]`` extra).
"""
