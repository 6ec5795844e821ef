"""The GQA rewrite: expand -> reshape -> [transpose] -> matmul becomes one batched GEMM per KV head (no expand).

Grouped-query attention stores KV heads ``(1, KV, S, D)`` and repeats each for ``G = H / KV`` query heads:
``reshape (1, KV, 1, S, D) -> expand (1, KV, G, S, D) -> reshape (1, H, S, D)``, so query head ``h`` reads KV head
``h // G``. :func:`match_gqa` recognises the two matmuls the seed names -- QK^T (``Q (1, H, Tq, D) @ transpose(K)``)
and scores x V (``P (1, H, Tq, S) @ V``) -- checking the exact structure (shapes, the expand axis, single consumers
of every intermediate); :func:`rewrite_gqa` replaces each by ``reshape(Q, (KV, G Tq, D)) @ K^T (KV, D, S)``
(resp. ``reshape(P, (KV, G Tq, S)) @ V (KV, S, D)``) reshaped back to ``(1, H, Tq, .)``: row ``g Tq + t`` of batch
``kv`` is query head ``kv G + g``, which is how ``(1, H, Tq, D)`` lies in memory. Every output element is the
same fold over the same products, so the rewrite preserves the denotation bit for bit (checked, not assumed).

``grouping="mod"`` is a PLANTED rewrite that pairs query head ``h`` with KV head ``h % KV`` (heads mis-grouped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from spec.ir.graph import Graph, GraphBuilder, Payload
from spec.ir.rewrites import Rewritten, eliminate_dead_nodes

__all__ = ["GqaMatch", "match_gqa", "rewrite_gqa", "GROUPINGS"]

GROUPINGS = ("div", "mod")


@dataclass(frozen=True)
class GqaMatch:
    """A matched GQA matmul: its id, variant ("qk" or "sv"), the query-side operand, the KV source, sizes."""

    matmul: int
    variant: str
    query: int
    kv_source: int
    chain: tuple[int, ...]
    kv: int
    group: int
    rows: int  # Tq
    inner: int  # D for qk, S for sv
    cols: int  # S for qk, D for sv


def _single(consumers: dict[int, tuple[int, ...]], n: int, c: int) -> bool:
    return consumers.get(n) == (c,)


def _expand_chain(graph: Graph, consumers: dict[int, tuple[int, ...]], r: int) -> tuple[int, int, int, int] | None:
    """(kv source, expand, unsqueeze reshape, G) when node r is reshape(expand(reshape(src))) of the GQA form."""
    rn = graph[r]
    if rn.kind != "reshape" or len(rn.out_shape) != 4:
        return None
    e = rn.parents[0]
    en = graph[e]
    if en.kind != "expand" or not _single(consumers, e, r) or len(en.out_shape) != 5:
        return None
    u = en.parents[0]
    un = graph[u]
    if un.kind != "reshape" or not _single(consumers, u, e) or len(un.out_shape) != 5:
        return None
    src = graph[un.parents[0]]
    one, kv, s, d = src.out_shape if len(src.out_shape) == 4 else (0, 0, 0, 0)
    b, kv2, g, s2, d2 = en.out_shape
    if (one, b) != (1, 1) or un.out_shape != (1, kv, 1, s, d) or (kv2, s2, d2) != (kv, s, d):
        return None
    if rn.out_shape != (1, kv * g, s, d):
        return None
    return src.id, e, u, g


def match_gqa(graph: Graph, mid: int) -> GqaMatch | None:
    """The GQA match rooted at matmul ``mid``, or None when any part of the structure differs."""
    consumers = graph.consumers()
    m = graph[mid]
    if m.kind != "matmul" or len(m.out_shape) != 4:
        return None
    a, b = m.parents
    bn = graph[b]
    variant, r, chain = "sv", b, (b,)
    if bn.kind == "transpose":
        dims = sorted(int(x) % 4 for x in (bn.attrs["dim0"], bn.attrs["dim1"]))
        if dims != [2, 3] or not _single(consumers, b, mid):
            return None
        variant, r, chain = "qk", bn.parents[0], (b, bn.parents[0])
    if not _single(consumers, r, chain[0] if variant == "qk" else mid):
        return None
    found = _expand_chain(graph, consumers, r)
    if found is None:
        return None
    src, e, u, g = found
    _, kv, s, d = graph[src].out_shape
    one, h, tq, inner = graph[a].out_shape
    if one != 1 or h != kv * g or inner != (d if variant == "qk" else s):
        return None
    return GqaMatch(mid, variant, a, src, chain + (e, u), kv, g, tq, inner, s if variant == "qk" else d)


def _emit(b: GraphBuilder, mt: GqaMatch, q: int, src: int, grouping: str) -> int:
    """The rewritten nodes of one match; returns the id holding the matmul's value."""
    kv, g, tq, inner, cols = mt.kv, mt.group, mt.rows, mt.inner, mt.cols
    s, d = (cols, inner) if mt.variant == "qk" else (inner, cols)
    if grouping == "div":
        qr = b.add("reshape", (q,), (kv, g * tq, inner), shape=(kv, g * tq, inner))
    else:  # PLANTED: head h = g KV + kv, i.e. KV head h % KV
        q5 = b.add("reshape", (q,), (1, g, kv, tq, inner), shape=(1, g, kv, tq, inner))
        qp = b.add("permute", (q5,), (1, kv, g, tq, inner), perm=(0, 2, 1, 3, 4))
        qr = b.add("reshape", (qp,), (kv, g * tq, inner), shape=(kv, g * tq, inner))
    kr = b.add("reshape", (src,), (kv, s, d), shape=(kv, s, d))
    if mt.variant == "qk":
        kr = b.add("transpose", (kr,), (kv, d, s), dim0=1, dim1=2)
    mm = b.add("matmul", (qr, kr), (kv, g * tq, cols))
    if grouping == "div":
        return b.add("reshape", (mm,), (1, kv * g, tq, cols), shape=(1, kv * g, tq, cols))
    m5 = b.add("reshape", (mm,), (1, kv, g, tq, cols), shape=(1, kv, g, tq, cols))
    mp = b.add("permute", (m5,), (1, g, kv, tq, cols), perm=(0, 2, 1, 3, 4))
    return b.add("reshape", (mp,), (1, kv * g, tq, cols), shape=(1, kv * g, tq, cols))


def rewrite_gqa(
    graph: Graph, payload: Payload, outputs: Iterable[int] | None = None, grouping: str = "div"
) -> tuple[Rewritten, list[GqaMatch]]:
    """Every matched GQA matmul rewritten to a per-KV-head batched GEMM; dead expand chains dropped."""
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}")
    outs = tuple(outputs) if outputs is not None else (len(graph) - 1,)
    matches = [mt for n in graph.nodes if (mt := match_gqa(graph, n.id)) is not None]
    by_id = {mt.matmul: mt for mt in matches}
    b = GraphBuilder()
    new: dict[int, int] = {}
    for n in graph.nodes:
        if n.id in by_id:
            mt = by_id[n.id]
            new[n.id] = _emit(b, mt, new[mt.query], new[mt.kv_source], grouping)
            continue
        entry: Any = payload.get(n.id)
        new[n.id] = b.add(
            n.kind,
            tuple(new[p] for p in n.parents),
            n.out_shape,
            params=dict(entry) if entry is not None else None,
            **dict(n.attrs),
        )
    g2, p2 = b.build()
    live = eliminate_dead_nodes(g2, p2, [new[o] for o in outs])
    mapping = {o: live.mapping[new[o]] for o in range(len(graph)) if new[o] in live.mapping}
    return Rewritten(live.graph, live.payload, mapping), matches
