"""A checkpoint records the Mamba-2 row order of in_proj/conv1d; one saved before the group-major order
(nothing recorded) is another model when the Mamba mixers have more than one group."""

from __future__ import annotations

import dataclasses

from models.mamba2 import IN_PROJ_LAYOUT
from trainer.checkpoint.compatibility import incompatibilities
from trainer.config import compose


def _state(model_config, **recorded) -> dict:
    return {"model_config": dataclasses.asdict(model_config), "precision_backend": "emulated", **recorded}


def test_an_unrecorded_row_order_is_refused_only_where_groups_reorder_rows():
    grouped = compose(["model=tiny"]).model  # 2 groups
    assert grouped.mamba_num_groups > 1
    problems = incompatibilities(_state(grouped), grouped, "emulated", {})
    assert any("Mamba in_proj/conv1d row order: checkpoint 'canonical'" in p for p in problems), problems
    assert incompatibilities(_state(grouped, mamba_layout=IN_PROJ_LAYOUT), grouped, "emulated", {}) == []

    single = compose(["model=study"]).model  # one group: both orders are the same rows
    assert single.mamba_num_groups == 1
    assert incompatibilities(_state(single), single, "emulated", {}) == []
