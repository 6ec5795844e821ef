"""Planted bugs of the indexing family: a row guard off by one (lets an index equal to the table size through)."""

from __future__ import annotations

from typing import Any

from native import indexing as ni
from obligations.core.symbolic import all_of

__all__ = ["rows_plan_off_by_one"]


def rows_plan_off_by_one(rows: Any, d: Any, m: Any, index: Any) -> ni.RowsPlan:
    """The shipped plan with the guard ``index <= rows``: an index equal to the table size is accepted."""
    p = ni.rows_plan(rows, d, m, index)
    return ni.RowsPlan(
        p.rows, p.d, p.m, p.index, all_of(index >= 0, index <= rows), *(p.admissible, p.table_elems, p.out_elems)
    )
