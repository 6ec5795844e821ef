"""ONNX's own node test cases (``onnx.backend.test.case.node``) run through ``spec.ir.onnx`` and the denotation.

Each case is one ONNX node with inputs and expected outputs computed by ONNX's NumPy reference. For every op the
importer maps (``spec.ir.onnx.supported_onnx_ops()``) the float32 cases are imported, denoted in binary32 and
compared output by output with the expected arrays. A case is recorded as

* ``bitwise``: every output equal bit for bit (NaN matches NaN);
* ``within``: not bitwise, but every element inside the op's stated tolerance (:data:`TOLERANCES`);
* ``refused``: the importer raised ``OnnxImportError`` (the reason names the node and what it refuses);
* ``mismatch``: imported, but an output is outside the tolerance or of another shape (a silent wrong answer);
* ``error``: the denotation failed on an imported graph.

Only the case modules of the supported ops are imported (``collect_testcases()`` would build all ~1900 cases, about
15 s); they are built once per process. ONNX's pool modules compute their expected outputs with a pure-Python
reference (about 10 s), so their float32 cases are read from ``tests/fixtures/onnx_node_cases_pool.npz`` (written by
:func:`write_fixture`, the onnx versions recorded in it: the writer's and those whose own build was checked to equal it
bit for bit, 1.23.2 and the GPU machines' 1.23.1) when the installed version is one of them. Graph inputs after
the first are promoted to initializers, as exported
models carry their weights; the first stays a graph input. The table in ``docs/graphs.md`` is :func:`table_markdown`
of :func:`run_conformance` (``tests/test_onnx_conformance.py`` keeps it current).
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CaseResult",
    "Tolerance",
    "TOLERANCES",
    "CASE_MODULES",
    "load_cases",
    "promote_inputs",
    "run_case",
    "run_conformance",
    "summary",
    "table_markdown",
    "ulp_distance",
    "write_fixture",
    "NodeAgreement",
    "node_by_node",
    "FIXTURE",
    "fixture_versions",
    "LOW_PRECISION",
    "REFERENCE_DISAGREES",
]

U = 2.0**-24
TINY = 2.0**-126  # an absolute floor: below the smallest normal, relative rounding statements do not hold

# ONNX op type -> the case modules of onnx.backend.test.case.node that hold its cases (default: op_type.lower()).
CASE_MODULES: dict[str, tuple[str, ...]] = {
    "BatchNormalization": ("batch_normalization",),
    "Range": ("rangeop",),
    "Max": ("max",),
    "Min": ("min",),
}


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: its name, ONNX op type, status and the reason or measure behind it."""

    name: str
    op_type: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Tolerance:
    """An op's stated tolerance: ``statement`` in words, ``check(inputs, got, want, mag) -> bool array`` per element
    (``mag()`` is the imported graph denoted on |operands|: |A||B| for the contractions, sum |x| for the pools)."""

    statement: str
    check: Callable[[list[np.ndarray], np.ndarray, np.ndarray, Callable[[], np.ndarray]], np.ndarray]


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Ulp distance of two binary32 arrays (the distance of their monotone integer keys; NaN vs NaN is 0)."""

    def key(x: np.ndarray) -> np.ndarray:
        u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.int64)
        return np.where(u & 0x80000000, -(u & 0x7FFFFFFF), u)

    d = np.abs(key(a) - key(b))
    return np.where(np.isnan(a) & np.isnan(b), 0, d)


def _ulps(n: int) -> Tolerance:
    def check(ins: list[np.ndarray], got: np.ndarray, want: np.ndarray, mag: Any) -> np.ndarray:
        return ulp_distance(got, want) <= n

    return Tolerance(f"within {n} ulp of ONNX's value (each side within a few ulp of the real value)", check)


def _ulps_or_abs(n: int, atol: float, what: str) -> Tolerance:
    def check(ins: list[np.ndarray], got: np.ndarray, want: np.ndarray, mag: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            near = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= atol
        return (ulp_distance(got, want) <= n) | near

    return Tolerance(f"within {n} ulp or {what} absolute (a bounded function: runtimes' tails are absolute)", check)


def _gelu_tolerance() -> Tolerance:
    """8 ulp, or |got - want| <= 16 u |x|: 0.5 x (1 + erf(x / sqrt 2)) cancels in 1 + erf for x < 0, where each
    side's erf (a few ulp of |erf| <= 1) and the add leave an absolute error of a few u in 1 + erf, times 0.5 |x|."""

    def check(ins: list[np.ndarray], got: np.ndarray, want: np.ndarray, mag: Any) -> np.ndarray:
        x = np.abs(ins[0].astype(np.float64))
        with np.errstate(all="ignore"):
            near = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= 16 * U * x + TINY
        return (ulp_distance(got, want) <= 8) | near

    return Tolerance("within 8 ulp or 16 u |x| absolute (the 1 + erf cancellation for x < 0)", check)


def _gamma(n: float) -> float:
    return n * U / (1 - n * U)


def attention_tolerance(node: Any, ins: list[np.ndarray], k: int, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """ONNX Attention's outputs (Y, present_key, present_value, qk_matmul_output), both sides against the real value.

    With D the head size, Lk the keys, S >= |q k^T scale| (scale max|Q| max|K| D, at most the softcap) and M = max|V|:
    each score is within gamma_(D+4) S, so each softmax weight within (2 gamma_(D+4) S + gamma_(Lk+16)) relatively,
    and Y within that times M (plus gamma_Lk M for the sum): |got - want| <= 2 (2 S gamma_(D+4) + 2 gamma_(Lk+16)) M.
    present_key/value are bit copies; qk_matmul_output within 2 (S gamma_(D+4) + 8 u cap) + 2 u |want| (the bias add),
    or as a softmax weight in mode 3.
    """
    import onnx

    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    by_name = dict(zip([n for n in node.input if n], ins, strict=False))
    q, kk, v = (np.asarray(by_name[node.input[i]], np.float64) for i in range(3))
    names = [node.input[i] if len(node.input) > i else "" for i in (4, 5)]
    past = [np.asarray(by_name[n], np.float64) for n in names if n]
    heads = int(a.get("q_num_heads", 1)) if q.ndim == 3 else 1
    d = q.shape[-1] // heads
    lk = kk.shape[-2] + (past[0].shape[-2] if past else 0)
    scale = float(a["scale"]) if "scale" in a else 1 / np.sqrt(d)
    kmax = max([float(np.abs(kk).max(initial=0))] + ([float(np.abs(past[0]).max(initial=0))] if past else []))
    vmax = max([float(np.abs(v).max(initial=0))] + ([float(np.abs(past[1]).max(initial=0))] if past else []))
    big_s = scale * float(np.abs(q).max(initial=0)) * kmax * d
    cap = float(a.get("softcap", 0) or 0)
    if cap > 0:
        big_s = min(big_s, cap)
    weight = 2 * big_s * _gamma(d + 4) + 2 * _gamma(lk + 16)
    g, w = got.astype(np.float64), want.astype(np.float64)
    if k in (1, 2):
        return ulp_distance(got, want) == 0
    if k == 0:
        bound = 2 * weight * vmax + TINY
    elif int(a.get("qk_matmul_output_mode", 0)) == 3:
        bound = 2 * weight + TINY
    else:
        bound = 2 * (big_s * _gamma(d + 4) + 8 * U * cap) + 2 * U * np.abs(w) + TINY
    with np.errstate(all="ignore"):
        return (np.abs(g - w) <= bound) | (np.isnan(g) & np.isnan(w)) | (g == w)


ATTENTION_STATEMENT = (
    "Y: |got - want| <= 2 (2 S gamma_(D+4) + 2 gamma_(Lk+16)) max|V| (S >= |q k^T scale|); present_key/value bit "
    "for bit; qk_matmul_output: 2 (S gamma_(D+4) + 8 u softcap) + 2 u |want| (attention_tolerance)"
)


def _relative(k: Callable[[list[np.ndarray], np.ndarray], float], what: str) -> Tolerance:
    """|got - want| <= 2 gamma_k (|want| + max |B|) + TINY: relative to the value (B, a norm's offset, where given)."""

    def check(ins: list[np.ndarray], got: np.ndarray, want: np.ndarray, mag: Any) -> np.ndarray:
        n = k(ins, want)
        gamma = n * U / (1 - n * U)
        g, w = got.astype(np.float64), want.astype(np.float64)
        off = float(np.max(np.abs(ins[2]))) if len(ins) > 2 and ins[2].size else 0.0  # a norm's B: cancellation
        with np.errstate(all="ignore"):
            ok = np.abs(g - w) <= 2 * gamma * (np.abs(w) + off) + TINY
        return ok | (np.isnan(g) & np.isnan(w)) | (g == w)

    return Tolerance(f"|got - want| <= 2 gamma_n (|want| + max abs B) + 2^-126, n = {what}", check)


def _dot(k: Callable[[list[np.ndarray], np.ndarray], float], what: str) -> Tolerance:
    """Both sides within gamma_k * (|A||B|) of the exact value: |got - want| <= 2 gamma_k mag, mag from |inputs|."""

    def check(ins: list[np.ndarray], got: np.ndarray, want: np.ndarray, mag: Any) -> np.ndarray:
        n = k(ins, want) + 2  # + alpha/beta scaling and the bias add
        gamma = n * U / (1 - n * U)
        m = np.abs(np.asarray(mag(), np.float64))
        g, w = got.astype(np.float64), want.astype(np.float64)
        with np.errstate(all="ignore"):
            ok = np.abs(g - w) <= 2 * gamma * m * (1 + 4 * gamma) + TINY
        return ok | (np.isnan(g) & np.isnan(w)) | (g == w)

    return Tolerance(
        f"|got - want| <= 2 gamma_(n+2) m + 2^-126, n = {what}, m the op on |operands| (both within the GEMM bound)",
        check,
    )


_BIT = Tolerance("bit for bit (NaN matches NaN)", lambda ins, got, want, mag: ulp_distance(got, want) == 0)


def _last_k(ins: list[np.ndarray], want: np.ndarray) -> float:
    return float(ins[0].shape[-1]) if ins[0].ndim else 1.0


def _numel_in(ins: list[np.ndarray], want: np.ndarray) -> float:
    return float(max(ins[0].size // max(want.size, 1), 1))


def _conv_k(ins: list[np.ndarray], want: np.ndarray) -> float:
    return float(np.prod(ins[1].shape[1:])) if len(ins) > 1 else 1.0


def _norm_k(ins: list[np.ndarray], want: np.ndarray) -> float:
    return float(ins[0].size) + 8.0


TOLERANCES: dict[str, Tolerance] = {}
for _op in (
    "Abs Add Sub Mul Div Neg Relu Sqrt Reciprocal Identity Flatten Reshape Transpose Concat Constant MaxPool "
    "Squeeze Unsqueeze Slice Expand Dropout Split Pad Max Min Clip Gather Cast Where"
).split():
    TOLERANCES[_op] = _BIT
for _op, _n in (("Exp", 2), ("Log", 4), ("Sin", 2), ("Cos", 2), ("Pow", 4), ("Erf", 4)):
    TOLERANCES[_op] = _ulps(_n)
TOLERANCES["Sigmoid"] = _ulps_or_abs(4, 2.0**-21, "2^-21")
TOLERANCES["Tanh"] = _ulps_or_abs(4, 2.0**-23, "2^-23")
TOLERANCES["LeakyRelu"] = TOLERANCES["PRelu"] = _BIT
TOLERANCES["HardSigmoid"] = TOLERANCES["HardSwish"] = _ulps_or_abs(2, 2.0**-23, "2^-23")
TOLERANCES["Softplus"] = _ulps_or_abs(8, 2.0**-22, "2^-22")
TOLERANCES["Mish"] = _ulps_or_abs(16, 2.0**-20, "2^-20")
TOLERANCES.update(
    {
        "Attention": Tolerance(ATTENTION_STATEMENT, lambda ins, got, want, mag: np.zeros(got.shape, bool)),
        "MatMul": _dot(lambda ins, w: float(ins[0].shape[-1]), "the inner dimension"),
        "Gemm": _dot(lambda ins, w: float(max(ins[0].shape)), "the inner dimension"),
        "Conv": _dot(_conv_k, "Cin kh kw"),
        "Resize": _dot(lambda ins, w: 2.0 * max(ins[0].shape) + 8, "2 max(input dims) + 8 (taps, two axes)"),
        "ConvTranspose": _dot(lambda ins, w: float(np.prod(ins[1].shape)), "Cin Cout kh kw"),
        "AveragePool": _dot(_numel_in, "the window size"),
        "GlobalAveragePool": _dot(_numel_in, "H W"),
        "ReduceSum": _dot(_numel_in, "the reduced count"),
        "ReduceMean": _dot(_numel_in, "the reduced count"),
        "Softmax": _relative(lambda ins, w: float(max(ins[0].shape)) + 12, "the axis length + 12 (exp, division)"),
        "LogSoftmax": _relative(lambda ins, w: float(max(ins[0].shape)) + 12, "the axis length + 12"),
        "LayerNormalization": _relative(_norm_k, "the element count + 8"),
        "RMSNormalization": _relative(_norm_k, "the element count + 8"),
        "BatchNormalization": _relative(lambda ins, w: 8.0, "8 (sub, add, sqrt, div, mul, add)"),
        "Gelu": _gelu_tolerance(),
    }
)


# -- the cases ------------------------------------------------------------------------------------------

_CACHE: dict[str, list[Any]] = {}
FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx_node_cases_pool.npz"
FIXTURE_MODULES = ("averagepool", "maxpool")

# Cases whose expected values ONNX writes with fewer digits than binary32 has (the reason, the absolute tolerance).
LOW_PRECISION: dict[str, tuple[str, float]] = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (
        "expected values written with 4 decimals (within 1e-4)",
        1e-4,
    ),
}


# Cases whose stored expected outputs differ from ONNX's own reference evaluator (onnx.reference) on the same model
# beyond the op's tolerance: the case module computes them with another helper (cubic resize by sizes: its own
# interpolate_nd, 40-60 ulp away from the op's separable float64 reference). They are judged against the reference
# evaluator, and the harness checks that the two ONNX answers do disagree (else the entry is stale: an error).
REFERENCE_DISAGREES: dict[str, str] = {
    "test_resize_downsample_sizes_cubic": "the case's interpolate_nd output differs from onnx.reference's Resize",
    "test_resize_upsample_sizes_cubic": "the case's interpolate_nd output differs from onnx.reference's Resize",
}


@dataclass(frozen=True)
class _Case:
    """A node test case read back from the fixture (the fields of onnx's TestCase that are used here)."""

    name: str
    model: Any
    data_sets: list[tuple[list[np.ndarray], list[np.ndarray]]]


def _build_module(mod: str) -> list[Any]:
    import onnx.backend.test.case.node as node_cases

    before = len(node_cases._NodeTestCases)
    node_cases._TargetOpType = None
    try:
        importlib.import_module(f"onnx.backend.test.case.node.{mod}")
    except ImportError:
        return []
    return list(node_cases._NodeTestCases[before:])


def write_fixture(path: Path = FIXTURE, also: tuple[str, ...] = ()) -> int:
    """Write the float32 cases of FIXTURE_MODULES (model bytes, inputs, outputs) with the onnx version (and the
    versions ``also`` whose build was checked to equal it); the count."""
    import onnx

    versions = ",".join(dict.fromkeys((onnx.__version__, *also)))
    d: dict[str, np.ndarray] = {"onnx_version": np.frombuffer(versions.encode(), np.uint8)}
    n = 0
    for mod in FIXTURE_MODULES:
        for c in _CACHE.setdefault(mod, _build_module(mod)):
            if not _float32_case(c):
                continue
            ins, outs = c.data_sets[0]
            d[f"{c.name}/model"] = np.frombuffer(c.model.SerializeToString(), np.uint8)
            for i, a in enumerate(ins):
                d[f"{c.name}/in{i}"] = a
            for i, a in enumerate(outs):
                d[f"{c.name}/out{i}"] = a
            n += 1
    np.savez_compressed(path, **d)
    return n


def fixture_versions(path: Path = FIXTURE) -> tuple[str, ...]:
    """The onnx versions whose own build of the pool cases the fixture equals, bit for bit (its ``onnx_version``
    field: the writer's, and any added once tests/test_onnx_conformance.py's slow fixture test passed under them)."""
    with np.load(path) as z:
        return tuple(v for v in bytes(z["onnx_version"]).decode().split(",") if v)


def _fixture_cases() -> list[Any] | None:
    """The fixture's cases, or None when it is absent or not known to equal the installed onnx version's build."""
    import onnx

    if not FIXTURE.exists() or onnx.__version__ not in fixture_versions():
        return None
    return _read_fixture(FIXTURE)


def _read_fixture(path: Path) -> list[Any]:
    import onnx

    with np.load(path) as z:
        names = sorted({k.split("/")[0] for k in z.files if "/" in k})
        out = []
        for name in names:
            ins = [z[f"{name}/in{i}"] for i in range(64) if f"{name}/in{i}" in z.files]
            outs = [z[f"{name}/out{i}"] for i in range(64) if f"{name}/out{i}" in z.files]
            out.append(_Case(name, onnx.load_from_string(bytes(z[f"{name}/model"])), [(ins, outs)]))
    return out


def load_cases(op_types: Iterable[str]) -> dict[str, list[Any]]:
    """ONNX's node test cases of ``op_types`` (TestCase objects), by op type; each case module built once."""
    out: dict[str, list[Any]] = {}
    for op in op_types:
        cases: list[Any] = []
        for mod in CASE_MODULES.get(op, (op.lower(),)):
            if mod not in _CACHE and mod in FIXTURE_MODULES:
                fixed = _fixture_cases()
                if fixed is not None:
                    for m in FIXTURE_MODULES:
                        _CACHE[m] = [c for c in fixed if c.name.startswith(f"test_{m}")]
            if mod not in _CACHE:
                _CACHE[mod] = _build_module(mod)
            cases += [c for c in _CACHE[mod] if c.model.graph.node[0].op_type == op]
        out[op] = cases
    return out


def _arrays(xs: Any) -> list[Any]:
    """NumPy scalars (ONNX writes some scalar inputs so) as 0-d arrays; anything else as it is."""
    return [np.asarray(a) if isinstance(a, np.generic) else a for a in xs]


def _float32_case(case: Any) -> bool:
    """Every input and output is an array, some input and every output float32."""
    ins, outs = (_arrays(x) for x in case.data_sets[0])
    if not all(isinstance(a, np.ndarray) for a in list(ins) + list(outs)) or not ins or not outs:
        return False
    return any(a.dtype == np.float32 for a in ins) and all(o.dtype == np.float32 for o in outs)


def _data_input(inputs: list[np.ndarray]) -> int:
    """Index of the input that stays a graph input: the first float32 one (Where's condition comes first)."""
    return next(i for i, a in enumerate(inputs) if np.asarray(a).dtype == np.float32)


def promote_inputs(model: Any, inputs: list[np.ndarray]) -> Any:
    """The model with every graph input but the first float32 one made an initializer holding its test value."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    k = _data_input(inputs)
    vis = list(g.input)
    for i, (vi, arr) in enumerate(zip(vis, inputs, strict=False)):
        if i != k:
            g.initializer.append(numpy_helper.from_array(np.asarray(arr), vi.name))
    del g.input[:]
    g.input.extend(vis[k : k + 1])
    return m


def _magnitude(imp: Any, x: np.ndarray, k: int) -> np.ndarray:
    """Output k of the imported graph denoted on |x| with every constant and parameter made |.|: |A||B|, sum |x|."""
    from spec.ir.denote import denote_all
    from spec.ir.graph import Payload

    payload = Payload({i: {n: np.abs(v) for n, v in e.items()} for i, e in imp.payload.entries.items()})
    res = denote_all(imp.graph, payload, [np.abs(x)])
    return np.asarray(res.value[imp.outputs[k]], np.float64) if hasattr(res, "value") else np.full(1, np.inf)


def run_case(case: Any) -> CaseResult:
    """Import, denote and compare one case."""
    from spec.ir.denote import denote_all
    from spec.ir.onnx import OnnxImportError, import_onnx

    op = case.model.graph.node[0].op_type
    ins, outs = (_arrays(x) for x in case.data_sets[0])
    try:
        imp = import_onnx(promote_inputs(case.model, ins))
    except OnnxImportError as e:
        return CaseResult(case.name, op, "refused", str(e))
    x = ins[_data_input(ins)]
    res = denote_all(imp.graph, imp.payload, [x])
    if not hasattr(res, "value"):
        return CaseResult(case.name, op, "error", str(res))
    tol = TOLERANCES.get(op, _BIT)
    worst = "bitwise"
    note = ""
    if case.name in REFERENCE_DISAGREES:
        from onnx.reference import ReferenceEvaluator

        feed = {i.name: a for i, a in zip(case.model.graph.input, ins, strict=False)}
        ref = [np.asarray(v, np.float32) for v in ReferenceEvaluator(case.model).run(None, feed)]
        gap = max(int(ulp_distance(r, w).max(initial=0)) for r, w in zip(ref, outs, strict=True))
        if gap <= 8:
            return CaseResult(case.name, op, "error", f"REFERENCE_DISAGREES entry is stale: only {gap} ulp apart")
        outs = ref
        note = f"judged against onnx.reference ({REFERENCE_DISAGREES[case.name]}, up to {gap} ulp); "
    for k, want in enumerate(outs):
        if k >= len(imp.outputs):
            return CaseResult(case.name, op, "mismatch", f"output {k} not imported")
        got = np.asarray(res.value[imp.outputs[k]], np.float32)
        if got.shape != want.shape:
            return CaseResult(case.name, op, "mismatch", f"output {k}: shape {list(got.shape)} != {list(want.shape)}")
        if (ulp_distance(got, want) == 0).all():
            continue
        if case.name in LOW_PRECISION:
            why, atol = LOW_PRECISION[case.name]
            if (np.abs(got.astype(np.float64) - want) <= atol).all():
                worst = "within"
                continue
        if op == "Attention":  # by the node's output slot (Y, present_key, present_value, qk_matmul_output)
            node = case.model.graph.node[0]
            slot = list(node.output).index(case.model.graph.output[k].name)
            ok = attention_tolerance(node, ins, slot, got, want)
        else:
            ok = tol.check(ins, got, want, lambda k=k: _magnitude(imp, x, k))
        if not ok.all():
            i = int(np.argmin(ok.reshape(-1)))
            return CaseResult(
                case.name,
                op,
                "mismatch",
                f"output {k}[{i}]: {got.reshape(-1)[i]!r} vs {want.reshape(-1)[i]!r} "
                f"({int(ulp_distance(got, want).reshape(-1)[i])} ulp; tolerance: {tol.statement})",
            )
        worst = "within"
    why = LOW_PRECISION[case.name][0] if case.name in LOW_PRECISION else tol.statement
    return CaseResult(case.name, op, worst, note + ("" if worst == "bitwise" else why))


@dataclass(frozen=True)
class NodeAgreement:
    """One ONNX node of a model: the denotation's value against a runtime's run of that node alone on the same
    inputs (the denotation's values of its inputs), judged by the op's tolerance."""

    index: int
    op_type: str
    status: str
    max_ulp: int
    detail: str = ""


def node_by_node(model: Any, imp: Any, values: tuple[np.ndarray, ...], run: Callable[[Any, dict], list]) -> list:
    """Every imported ONNX node of ``model`` checked alone: ``run(single-node model, feed)`` (a runtime, e.g.
    onnxruntime) on the denotation's values of the node's inputs against the denotation's value of its outputs,
    by :data:`TOLERANCES` (magnitudes from the single node imported and denoted on |inputs|)."""
    import onnx
    from onnx import helper, numpy_helper

    opset = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    out: list[NodeAgreement] = []
    for i, node in enumerate(model.graph.node):
        outs = [n for n in node.output if n and n in imp.tensors]
        if not outs:
            continue  # folded at import (shape arithmetic, constants)
        dyn = [n for n in dict.fromkeys(node.input) if n and n in imp.tensors and n not in imp.constants]
        consts = [n for n in dict.fromkeys(node.input) if n and n in imp.constants]
        feed = {n: np.asarray(values[imp.tensors[n]], np.float32) for n in dyn}
        g = helper.make_graph(
            [node],
            f"node{i}",
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(feed[n].shape)) for n in dyn],
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outs],
            [numpy_helper.from_array(np.asarray(imp.constants[n]), n) for n in consts],
        )
        single = helper.make_model(g, opset_imports=opset, ir_version=model.ir_version)
        wants = run(single, feed)
        tol = TOLERANCES.get(node.op_type, _BIT)
        status, worst, detail = "bitwise", 0, ""
        for k, name in enumerate(outs):
            got = np.asarray(values[imp.tensors[name]], np.float32)
            want = np.asarray(wants[k], np.float32)
            if got.shape != want.shape:
                status, detail = "mismatch", f"{name}: shape {list(got.shape)} vs {list(want.shape)}"
                break
            d = ulp_distance(got, want)
            worst = max(worst, int(d.max(initial=0)))
            if not d.any():
                continue

            def mag(name: str = name, single: Any = single, xs: tuple = tuple(feed[n] for n in dyn)) -> np.ndarray:
                return _abs_denotation(single, xs, name)

            ins = [feed[n] if n in feed else np.asarray(imp.constants[n], np.float32) for n in node.input if n]
            ok = tol.check(ins, got, want, mag)
            if not ok.all():
                j = int(np.argmin(ok.reshape(-1)))
                status = "mismatch"
                detail = f"{name}[{j}]: {got.reshape(-1)[j]!r} vs {want.reshape(-1)[j]!r} ({tol.statement})"
                break
            status = "within"
        out.append(NodeAgreement(i, node.op_type, status, worst, detail))
    return out


def _abs_denotation(model: Any, xs: tuple[np.ndarray, ...], name: str) -> np.ndarray:
    """Tensor ``name`` of ``model`` imported and denoted on |xs| with every parameter made |.|."""
    from spec.ir.denote import denote_all
    from spec.ir.graph import Payload
    from spec.ir.onnx import import_onnx

    sub = import_onnx(model)
    payload = Payload({j: {n: np.abs(v) for n, v in e.items()} for j, e in sub.payload.entries.items()})
    res = denote_all(sub.graph, payload, [np.abs(x) for x in xs])
    return np.asarray(res.value[sub.tensors[name]], np.float64)


def run_conformance(op_types: Iterable[str] | None = None, names: Iterable[str] | None = None) -> list[CaseResult]:
    """Every float32 case of ``op_types`` (default: the importer's supported ops; ``names``: only those cases), in op
    then case order."""
    from spec.ir.onnx import supported_onnx_ops

    ops = sorted(op_types) if op_types is not None else list(supported_onnx_ops())
    names = None if names is None else set(names)
    out: list[CaseResult] = []
    with np.errstate(all="ignore"):
        for cases in load_cases(ops).values():
            for case in sorted(cases, key=lambda c: c.name):
                if _float32_case(case) and (names is None or case.name in names):
                    out.append(run_case(case))
    return out


def summary(results: Iterable[CaseResult]) -> dict[str, int]:
    """Counts by status."""
    counts = {"bitwise": 0, "within": 0, "refused": 0, "mismatch": 0, "error": 0}
    for r in results:
        counts[r.status] += 1
    return counts


def table_markdown(results: list[CaseResult]) -> str:
    """The conformance table: one row per op (counts by status), then every refusal and mismatch with its reason."""
    by_op: dict[str, list[CaseResult]] = {}
    for r in results:
        by_op.setdefault(r.op_type, []).append(r)
    lines = [
        "| ONNX op | cases | bitwise | within tolerance | refused | mismatch | tolerance |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for op, rs in sorted(by_op.items()):
        c = summary(rs)
        tol = _cell(TOLERANCES.get(op, _BIT).statement)
        lines.append(
            f"| {op} | {len(rs)} | {c['bitwise']} | {c['within']} | {c['refused']} | {c['mismatch'] + c['error']} "
            f"| {tol} |"
        )
    c = summary(results)
    n = len(results)
    passed = c["bitwise"] + c["within"]
    lines.append(
        f"| **all** | {n} | {c['bitwise']} | {c['within']} | {c['refused']} | {c['mismatch'] + c['error']} | "
        f"{passed}/{n} pass ({100.0 * passed / max(n, 1):.1f}%) |"
    )
    odd = [r for r in results if r.status not in ("bitwise", "within")]
    if odd:
        lines += ["", "| case | status | reason |", "| --- | --- | --- |"]
        lines += [f"| {r.name} | {r.status} | {_cell(r.detail)} |" for r in odd]
    return "\n".join(lines) + "\n"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def by_status(results: Iterable[CaseResult]) -> Mapping[str, list[str]]:
    """Case names by status."""
    out: dict[str, list[str]] = {}
    for r in results:
        out.setdefault(r.status, []).append(r.name)
    return out


def write_docs(path: Path | None = None) -> None:
    """Rewrite the conformance table between its markers in docs/graphs.md."""
    doc = path or Path(__file__).resolve().parent.parent / "docs" / "graphs.md"
    begin, end = "<!-- onnx-conformance:begin -->", "<!-- onnx-conformance:end -->"
    text = doc.read_text()
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{begin}\n{table_markdown(run_conformance())}{end}{tail}")


if __name__ == "__main__":
    import sys

    if "--write-fixture" in sys.argv:
        print(f"{write_fixture()} cases written to {FIXTURE}")
    if "--write-docs" in sys.argv:
        write_docs()
    if len(sys.argv) == 1:
        res = run_conformance()
        print(table_markdown(res))


# -- registered tests (contracts/graph-ir-v1.yaml) ------------------------------------------------------------

# The quick profile's ops: the cheap cases of the ops exporters write most (the full profile and
# tests/test_onnx_conformance.py run every supported op).
QUICK_OPS = (
    "Add Sub Mul Div Relu Sigmoid Tanh Softmax Gemm MatMul Reshape Transpose Concat Flatten Slice Split Gather "
    "Unsqueeze Squeeze ReduceMean Max Min Clip Dropout Identity"
).split()


def _register() -> None:
    """Register ir.onnx_conformance and ir.onnx_window (and keep them as module attributes for the tests)."""
    from falsification.registry import FalsifyContext, guarded, register_test
    from obligations.core.results import Outcome, passed, skipped, violated

    @register_test("ir.onnx_conformance", devices=("host", "cuda"))
    @guarded()
    def onnx_conformance(ctx: FalsifyContext) -> Outcome:
        """ONNX's float32 node test cases through the importer and the denotation: no mismatch, >= 95% pass."""
        try:
            import onnx  # noqa: F401
        except ImportError as exc:
            return skipped(f"the onnx package is not installed ({exc})")
        from spec.ir.onnx import supported_onnx_ops

        ops = list(ctx.params.get("ops") or (QUICK_OPS if ctx.profile == "quick" else supported_onnx_ops()))
        res = run_conformance(ops)
        counts = summary(res)
        ok = counts["bitwise"] + counts["within"]
        ev = {**counts, "ops": len(ops), "target": 0.95}
        bad = [r for r in res if r.status in ("mismatch", "error")]
        if bad:
            return violated(
                {"case": bad[0].name, "detail": bad[0].detail},
                f"{bad[0].name}: {bad[0].detail}",
                cases_run=len(res),
                **ev,
            )
        if ok < 0.95 * len(res):
            return violated(
                {"passed": ok, "cases": len(res)}, f"only {ok}/{len(res)} cases pass", cases_run=len(res), **ev
            )
        return passed(cases=len(res), **ev)

    @register_test("ir.onnx_window", devices=("host", "cuda"))
    @guarded()
    def onnx_window(ctx: FalsifyContext) -> Outcome:
        """spec.ir.ops.window_plan's output length equals ONNX's reference arithmetic on a bounded grid."""
        try:
            from onnx.reference.ops.op_pool_common import get_output_shape_explicit_padding as ref
        except ImportError as exc:
            return skipped(f"the onnx package is not installed ({exc})")
        from spec.ir.ops import window_plan

        n = 0
        for size, k, s, d, b, e, c in itertools.product(
            range(1, 8), range(1, 5), range(1, 4), range(1, 3), range(4), range(4), (False, True)
        ):
            p = window_plan(size, k, s, d, b, e, c)
            if not p["valid"]:
                continue
            n += 1
            want = int(ref([b, e], [size], [k], [s], [d], c)[0][0])
            if want != p["out"]:
                cex = {
                    "size": size,
                    "kernel": k,
                    "stride": s,
                    "dilation": d,
                    "pad_begin": b,
                    "pad_end": e,
                    "ceil": c,
                    "plan": p["out"],
                    "onnx": want,
                }
                return violated(cex, f"window_plan gives {p['out']} where ONNX's reference gives {want}", cases_run=n)
        return passed(cases=n, reference="onnx.reference.ops.op_pool_common.get_output_shape_explicit_padding")

    globals().update(onnx_conformance_test=onnx_conformance, onnx_window_test=onnx_window)


_register()
