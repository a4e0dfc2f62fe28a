"""docs/planning.md's 12B table is what trainer.planning.buyers_table prints (regenerate: python -m
trainer.planning.buyers_table --write)."""

from __future__ import annotations

from trainer.planning import buyers_table


def test_the_docs_table_is_the_planners():
    held = buyers_table.table_in(buyers_table.DOC.read_text())
    assert held == buyers_table.render(), "docs/planning.md is stale: python -m trainer.planning.buyers_table --write"


def test_replace_in_keeps_the_rest_of_the_doc():
    text = f"before\n{buyers_table.BEGIN}\nold\n{buyers_table.END}\nafter\n"
    assert buyers_table.replace_in(text, "new") == f"before\n{buyers_table.BEGIN}\nnew\n{buyers_table.END}\nafter\n"
