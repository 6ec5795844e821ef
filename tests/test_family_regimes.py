"""Regimes and guard boundaries of the fusion kernels: each proved, each witness run by its consumer (scan's and FFT's
pairs are checked the same way by `kc check --strict contracts`); a planted guard that lets an index past the table
through is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from obligations.check import check_contract

ROOT = Path(__file__).resolve().parent.parent
# (contract, regimes item, the falsify item that runs its witnesses)
PAIRS = [
    ("fusion-v1", "FUSION-PLAN-regimes", "FUSION-KERNEL-witnesses"),
    ("fusion-v1", "FUSION-PLAN-regimes", "FUSION-ROPE-witnesses"),
    ("fusion-v1", "FUSION-EMBED-regimes", "FUSION-EMBED-witnesses"),
    ("fusion-v1", "FUSION-SOFTMAX-regimes", "FUSION-SOFTMAX-witnesses"),
    ("fusion-v1", "FUSION-RMSNORM-regimes", "FUSION-RMSNORM-witnesses"),
    ("fusion-v1", "FUSION-RMSNORM-rows-regimes", "FUSION-RMSNORM-rows-witnesses"),
]


@pytest.fixture(scope="module")
def items() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for contract in sorted({c for c, _, _ in PAIRS}):
        ids = sorted({i for c, r, f in PAIRS if c == contract for i in (r, f)})
        out.update({it["id"]: it for it in check_contract(ROOT / "contracts" / f"{contract}.yaml", only=ids)["items"]})
    return out


@pytest.mark.parametrize(("contract", "regimes", "consumer"), PAIRS, ids=[p[2] for p in PAIRS])
def test_every_regime_and_boundary_witness_runs(items, contract, regimes, consumer):
    r, f = items[regimes], items[consumer]
    assert r["status"] == "proved", r.get("reason")
    assert f["status"] == "passed", (f.get("reason"), f.get("counterexample"))
    ev = f["evidence"]
    assert ev["regimes_unreached"] == [] and set(ev["regimes_reached"]) == set(r["evidence"]["regimes"])
    rejects = [n for n in r["evidence"]["witnesses"] if n.endswith("@reject")]
    assert ev.get("boundaries_unreached", []) == []
    assert all(ev["boundaries_reached"][n] == 1 for n in rejects)  # every rejected input was refused


def test_embedding_index_equal_to_the_table_size_is_a_rejected_witness(items):
    w = items["FUSION-EMBED-regimes"]["evidence"]["witnesses"]
    assert w["index < vocab @reject"]["index"] == w["index < vocab @reject"]["vocab"]
    assert w["index >= 0 @reject"]["index"] == -1
    rows = items["FUSION-RMSNORM-regimes"]["evidence"]["witnesses"]
    assert rows["d <= 12268 @accept"]["d"] == 12268 and rows["d <= 12268 @reject"]["d"] == 12269


def test_a_guard_that_lets_an_index_past_the_table_through_is_caught(monkeypatch):
    """Planted: the embedding's host path reads row index mod vocab (no error at index == vocab): the rejected
    boundary witness runs instead of being refused, and the item fails with kind guard."""
    import numpy as np

    from native import fusion as nf

    real = nf.run_program

    def wrapping(g, p, inputs, device="auto", **kw):
        node = g.nodes[-1]
        if node.kind == "embedding":
            table = np.asarray(p.get(node.id)["table"], np.float32)
            ids = np.asarray(inputs[0], np.int64) % max(table.shape[0], 1)
            return {node.id: table[ids]}
        return real(g, p, inputs, device, **kw)

    monkeypatch.setattr(nf, "run_program", wrapping)
    it = check_contract(ROOT / "contracts" / "fusion-v1.yaml", only=["FUSION-EMBED-regimes", "FUSION-EMBED-witnesses"])[
        "items"
    ]
    bad = {i["id"]: i for i in it}["FUSION-EMBED-witnesses"]
    assert bad["status"] == "violated" and bad["counterexample"]["kind"] == "guard", bad.get("counterexample")


def test_conv2d_over_a_zero_width_padded_input_denotes_its_windows():
    """IR-CONV-regimes' smallest accepted witnesses are zero-width inputs whose padding makes the windows: the shape
    rule accepts them, and the denotation (which once failed to reshape the empty input) gives bias-only windows."""
    import numpy as np

    from spec.ir.denote import denote_all
    from spec.ir.graph import GraphBuilder

    b = GraphBuilder()
    attrs = {"out_channels": 1, "kernel": (1, 1), "stride": (1, 1), "padding": (0, 1), "dilation": (1, 1)}
    params = {"weight": np.ones((1, 1, 1, 1)), "bias": np.full(1, 0.5)}
    b.add("conv2d", (b.add("input", (), (1, 1, 1, 0)),), (1, 1, 1, 2), params=params, **attrs)
    g, p = b.build()
    y = denote_all(g, p, {0: np.zeros((1, 1, 1, 0), np.float32)}).value[1]
    assert y.shape == (1, 1, 1, 2) and np.all(y == np.float32(0.5))
