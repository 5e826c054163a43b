"""ReOPD distillation (docs/design.md §7).

* :mod:`.pool` — trajectory pool format (safetensors + JSON), validator, chat-JSONL converter.
* :mod:`.sampler` — κ^t (trajectory, agent turn) sampler and static-shape batches.
* :mod:`.losses` — forward KL on top-k + tail, JSD(β), reverse-KL policy gradient, SFT.
* :mod:`.teacher_table` — exported teacher logits aligned to pool tokens.
* :mod:`.learner` / :mod:`.trainer` — jitted train step and the host loop of ``train.distill``;
  beside the trainer: :mod:`.validation` (config checks), :mod:`.batches` (a micro-step's
  rows), :mod:`.host_update` (one update of every seed), :mod:`.host_state` (checkpointed host
  counters), :mod:`.evaluation` (success, ratio diagnostic, gate), :mod:`.results` (the end),
  :mod:`.stepping` (a run stepped update by update by its caller: timing studies, benchmarks).
* :mod:`.task` — the built-in multi-turn calculator task (teacher script needs ``[torch]``).
* :mod:`.scoring`, :mod:`.logits_store`, :mod:`.export` — PyTorch teacher-logit exporter.

Importing this package never imports torch.
"""
