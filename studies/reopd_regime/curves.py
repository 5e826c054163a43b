"""Learning curves of a trainer run, copied from its TensorBoard events into JSON (issue 44,
item 6; reading needs the ``[dev]`` extra's ``tensorboard``): ``{tag: [[step, value], ...]}`` for the per-update ``distill/loss``, ``distill/kl`` and
``distill/grad_norm`` and the ``eval/success_rate`` points, so a run's record carries them."""
from __future__ import annotations

from pathlib import Path

TAGS = ("distill/loss", "distill/kl", "distill/grad_norm", "eval/success_rate")


def read(tb_dir: Path, tags: tuple = TAGS) -> dict:
    """Every scalar point of ``tags`` under ``tb_dir`` (all event files; a step written twice,
    e.g. by a resumed run, keeps its last value), sorted by step; {} if there is no folder."""
    # lazy: tensorboard (the reader) is a [dev] extra; the trainer writes with tensorboardX
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tb_dir = Path(tb_dir)
    if not tb_dir.is_dir():
        return {}
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    have = set(acc.Tags().get("scalars", []))
    out = {}
    for tag in tags:
        if tag in have:
            pts = {}
            for ev in acc.Scalars(tag):
                pts[int(ev.step)] = float(ev.value)
            out[tag] = [[s, pts[s]] for s in sorted(pts)]
    return out
