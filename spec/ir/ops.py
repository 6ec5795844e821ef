"""The op vocabulary of the graph IR: one registered :class:`OpKind` per op tag.

Each entry states the op's arity, its attributes (validated when a graph is checked), the payload entry it
reads (parameters live outside the graph, keyed by node id), its shape rule and its meaning in one line
(the denotation in :mod:`spec.ir.denote` implements exactly that line).

Shape rules take the parents' *declared* shapes (each already checked against its own inference earlier in
id order), the node's attributes and its declared shape, and return the inferred shape or raise
:class:`ShapeRuleError`. The per-dimension arithmetic (convolution/pool output sizes, slices, concat,
broadcast, element counts, attention heads) is written plan-style in :func:`conv_plan`, :func:`pool_plan`,
:func:`slice_plan`, :func:`concat_plan`, :func:`broadcast_plan`, :func:`reshape_plan`, :func:`attention_plan`
and :func:`numel`:
the shape rules call them with ints, and ``contracts/graph-ir-v1.yaml`` calls the same functions with Z3
terms (one source, two meanings). Nothing in them branches on a dimension with ``if``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from obligations.core.symbolic import all_of, as_type, select, smax

__all__ = [
    "ELEMENTWISE_OP_NAMES",
    "Shape",
    "AttrSpec",
    "OpKind",
    "ShapeRuleError",
    "OPS",
    "register_op",
    "get_op",
    "op_names",
    "MAX_NUMEL",
    "REQUIRED",
    "numel",
    "conv_plan",
    "pool_plan",
    "slice_plan",
    "window_plan",
    "concat_plan",
    "broadcast_plan",
    "reshape_plan",
    "attention_plan",
    "ATTENTION_HEAD_DIM_MAX",
    "ATTENTION_GRID_Y_MAX",
]

# IR elementwise op -> the spec.elementwise operation (and native.elementwise kernel) that gives it meaning:
# one table for the denotation, the reference executor and the fusion code generator.
ELEMENTWISE_OP_NAMES: dict[str, str] = {
    "add": "add",
    "sub": "sub",
    "mul_elem": "mul",
    "div": "div",
    "maxElem": "max",
    "minElem": "min",
    "sqrt": "sqrt",
    "inv": "inv",
    "neg": "neg",
    "abs": "abs",
    "relu": "relu",
    "exp": "exp",
    "log": "log",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "gelu": "gelu",
}

Shape = tuple[int, ...]
MAX_NUMEL = 1 << 40  # largest element count a shape may have (the reduction kernels index up to 2^40)
REQUIRED = object()  # AttrSpec default meaning "must be given"


class ShapeRuleError(ValueError):
    """A shape rule's refusal: the parents' shapes or the attributes do not fit the op."""


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its name, its kind (int, ints, bool, uint64, float, str) and its default."""

    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True)
class OpKind:
    """One op of the vocabulary: arity (None = one or more; a tuple = one of those counts), attributes, payload kind,
    shape rule, meaning."""

    name: str
    arity: int | tuple[int, ...] | None
    category: str
    shape_rule: Callable[[tuple[Shape, ...], Mapping[str, Any], Shape], Shape]
    meaning: str
    attrs: tuple[AttrSpec, ...] = ()
    payload: str | None = None  # which Payload entry kind the node reads (keyed by its id), or None

    def attr_names(self) -> tuple[str, ...]:
        """Names of the op's attributes, in declaration order."""
        return tuple(a.name for a in self.attrs)

    def arity_text(self) -> str:
        """The arity as a readable string ('2', '>= 1', '3 or 4')."""
        if isinstance(self.arity, tuple):
            return " or ".join(str(k) for k in self.arity)
        return ">= 1" if self.arity is None else str(self.arity)

    def accepts_arity(self, k: int) -> bool:
        """Whether a node of this op may have ``k`` parents."""
        if isinstance(self.arity, tuple):
            return k in self.arity
        return k >= 1 if self.arity is None else k == self.arity


OPS: dict[str, OpKind] = {}


def register_op(op: OpKind) -> OpKind:
    """Add an op to the registry (names are unique)."""
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is registered twice")
    OPS[op.name] = op
    return op


def get_op(name: str) -> OpKind | None:
    """The registered op called ``name``, or None."""
    return OPS.get(name)


def op_names() -> tuple[str, ...]:
    """Every registered op name, in registration order."""
    return tuple(OPS)


# -- plan-style arithmetic: run with ints by the shape rules, with Z3 terms by the contract ---------------


def _mul_sat(acc: Any, d: Any) -> Any:
    """acc * d when it stays <= MAX_NUMEL, else MAX_NUMEL + 1 (computed without overflowing int64)."""
    d = as_type(d, "int64")
    ok = acc <= MAX_NUMEL // smax(d, 1)
    return select(ok, acc * select(ok, d, 0), MAX_NUMEL + 1)


def numel(*dims: Any) -> Any:
    """Element count of a shape, saturated: MAX_NUMEL + 1 once any prefix product exceeds MAX_NUMEL."""
    acc: Any = 1
    for d in dims:
        acc = _mul_sat(acc, d)
    return acc


def conv_plan(size: Any, kernel: Any, stride: Any, padding: Any, dilation: Any) -> dict[str, Any]:
    """Output length of a convolution window sweep: floor((size + 2 pad - dil (k - 1) - 1) / stride) + 1."""
    span = dilation * (kernel - 1) + 1
    padded = size + 2 * padding
    valid = all_of(size >= 0, kernel >= 1, stride >= 1, dilation >= 1, padding >= 0, span <= padded)
    out = select(valid, smax(padded - span, 0) // smax(stride, 1) + 1, 0)

    def start(j: Any) -> Any:
        """Padded-input index of the first tap of output position j."""
        return j * stride

    def last_tap(j: Any) -> Any:
        """Padded-input index of the last tap of output position j."""
        return j * stride + dilation * (kernel - 1)

    rest, sstep = padded - span, smax(stride, 1)
    regimes = {  # the sweep's shapes: one window, windows ending on the padded input's last cell, or short of it
        "one_window": rest < sstep,
        "windows_exact": all_of(rest >= sstep, rest % sstep == 0),
        "windows_remainder": all_of(rest >= sstep, rest % sstep != 0),
        "dilated": dilation > 1,
        "padded": padding > 0,
    }
    return {
        "valid": valid,
        "out": out,
        "span": span,
        "padded": padded,
        "start": start,
        "last_tap": last_tap,
        "regimes": regimes,
    }


def pool_plan(size: Any, kernel: Any, stride: Any, padding: Any) -> dict[str, Any]:
    """Pool output length: the conv rule with dilation 1, and padding at most half the window (PyTorch)."""
    c = conv_plan(size, kernel, stride, padding, 1)
    valid = all_of(c["valid"], 2 * padding <= kernel)
    regimes = {k: v for k, v in c["regimes"].items() if k != "dilated"}  # dilation is 1
    return {**c, "valid": valid, "out": select(valid, c["out"], 0), "regimes": regimes}


def window_plan(
    size: Any, kernel: Any, stride: Any, dilation: Any, pad_begin: Any, pad_end: Any, ceil: Any
) -> dict[str, Any]:
    """ONNX's window sweep along one axis (Conv, MaxPool, AveragePool): explicit pads, dilation, ceil_mode.

    span = dilation (kernel - 1) + 1, padded = size + pad_begin + pad_end; out = floor((padded - span) / stride) + 1,
    or with ceil_mode the ceiling, less one when that last window would start past the input and its begin pad
    (ONNX's rule). Tap t of window j reads input index j stride + t dilation - pad_begin; the importer pads the input
    explicitly to padded + extra (extra > 0 only for a ceil_mode window overhanging the end pad).
    """
    span = dilation * (kernel - 1) + 1
    padded = size + pad_begin + pad_end
    valid = all_of(size >= 1, kernel >= 1, stride >= 1, dilation >= 1, pad_begin >= 0, pad_end >= 0, span <= padded)
    rest = smax(padded - span, 0)
    sstep = smax(stride, 1)
    floor_out = rest // sstep + 1
    ceil_out = floor_out + select(rest % sstep != 0, 1, 0)
    late = (ceil_out - 1) * sstep >= size + pad_begin  # the last window would start past the input and its begin pad
    out = select(valid, select(ceil, ceil_out - select(late, 1, 0), floor_out), 0)
    need = smax(out - 1, 0) * sstep + span
    extra = smax(need - padded, 0)

    def tap(j: Any, t: Any) -> Any:
        """Input index read by tap t of window j (negative or >= size: padding)."""
        return j * stride + t * dilation - pad_begin

    return {"valid": valid, "out": out, "span": span, "padded": padded, "extra": extra, "tap": tap}


def slice_plan(dim: Any, start: Any, stop: Any, step: Any) -> dict[str, Any]:
    """Length of x[start:stop:step] along one axis with 0 <= start <= stop <= dim and step >= 1."""
    valid = all_of(start >= 0, start <= stop, stop <= dim, step >= 1)
    width = smax(stop - start, 0)
    sstep = smax(step, 1)
    q = width // sstep
    out = select(valid, q + select(q * sstep < width, 1, 0), 0)

    def index(j: Any) -> Any:
        """Source index of output position j."""
        return start + j * step

    regimes = {  # empty, every element, every step-th ending on stop - 1, or short of it
        "empty": stop == start,
        "unit_step": all_of(step == 1, stop > start),
        "strided_exact": all_of(step > 1, stop > start, smax(stop - start - 1, 0) % sstep == 0),
        "strided_partial": all_of(step > 1, stop > start, smax(stop - start - 1, 0) % sstep != 0),
    }
    return {"valid": valid, "out": out, "index": index, "regimes": regimes}


def concat_plan(a: Any, b: Any) -> dict[str, Any]:
    """Concatenating lengths a and b along the axis gives a + b; output position p reads a[p] or b[p - a]."""
    out = a + b

    def from_first(p: Any) -> Any:
        """Output position p comes from the first operand."""
        return p < a

    def source(p: Any) -> Any:
        """Index of output position p inside the operand it comes from."""
        return select(p < a, p, p - a)

    return {"out": out, "from_first": from_first, "source": source}


def broadcast_plan(src: Any, dst: Any) -> dict[str, Any]:
    """NumPy broadcasting of one source dimension to a target one: equal, or a source of 1 repeated."""
    ok = all_of(src >= 0, dst >= 0, (src == dst) | (src == 1))

    def source(j: Any) -> Any:
        """Source index read by target index j."""
        return select(src == 1, 0, j)

    return {"ok": ok, "out": dst, "source": source}


def reshape_plan(a0: Any, a1: Any, a2: Any, b0: Any, b1: Any) -> dict[str, Any]:
    """Reshape (a0, a1, a2) -> (b0, b1): accepted iff both element counts are equal and at most MAX_NUMEL."""
    na = numel(a0, a1, a2)
    nb = numel(b0, b1)
    return {"na": na, "nb": nb, "accepts": all_of(na == nb, na <= MAX_NUMEL)}


# The attention family's admissible calls (native.attention.attention_plan; spec cannot import native, so the two
# limits are restated here and the contract item IR-SHAPE-attention-family enumerates both guards side by side).
ATTENTION_HEAD_DIM_MAX = 128  # native.attention.HEAD_DIM_MAX
ATTENTION_GRID_Y_MAX = 65535  # batch * heads_q is the kernels' grid y (native.attention.MAX_GRID_Y)


def attention_plan(batch: Any, heads_q: Any, heads_kv: Any, seq_q: Any, seq_k: Any, head_dim: Any) -> dict[str, Any]:
    """Attention shapes q (batch, heads_q, seq_q, head_dim), k and v (batch, heads_kv, seq_k, head_dim): GQA groups.

    Accepted iff heads_q is a positive multiple of heads_kv (group = heads_q / heads_kv query heads per KV head),
    1 <= head_dim <= 128 and batch * heads_q <= 65535 (the family's kernels); query head h reads KV head h // group.
    """
    hkv = smax(heads_kv, 1)
    group = heads_q // hkv
    grid_y = as_type(batch, "int64") * heads_q
    valid = all_of(
        batch >= 1,
        heads_kv >= 1,
        heads_q >= heads_kv,
        heads_q % hkv == 0,
        head_dim >= 1,
        head_dim <= ATTENTION_HEAD_DIM_MAX,
        seq_q >= 0,
        seq_k >= 0,
        grid_y <= ATTENTION_GRID_Y_MAX,
    )

    def kv_head(h: Any) -> Any:
        """The KV head query head h reads."""
        return h // smax(group, 1)

    return {"valid": valid, "group": group, "grid_y": grid_y, "kv_head": kv_head}


# -- shape rules over whole shapes (ints) ----------------------------------------------------------------


def _fail(msg: str) -> Shape:
    raise ShapeRuleError(msg)


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis; ShapeRuleError when out of range."""
    if not -rank <= axis < rank:
        _fail(f"{what} {axis} out of range for rank {rank}")
    return axis % rank


def _check_numel(shape: Shape) -> Shape:
    if any(d < 0 for d in shape):
        _fail(f"negative dimension in {list(shape)}")
    if numel(*shape) > MAX_NUMEL:
        _fail(f"{list(shape)} has more than 2^40 elements")
    return tuple(shape)


def _declared(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    return _check_numel(declared)


def _same(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    first = ins[0]
    for s in ins[1:]:
        if s != first:
            _fail(f"operand shapes differ: {list(first)} vs {list(s)} (broadcast only through broadcastTo)")
    return first


def _reshape(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    target = _check_numel(tuple(attrs["shape"]))
    if numel(*ins[0]) != numel(*target):
        _fail(f"reshape {list(ins[0])} -> {list(target)} changes the element count")
    return target


def _flatten(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = ins[0]
    if not s:
        return (1,)
    lo, hi = _axis(attrs["start"], len(s), "start"), _axis(attrs["end"], len(s), "end")
    if lo > hi:
        _fail(f"flatten start {attrs['start']} after end {attrs['end']} for {list(s)}")
    return s[:lo] + (numel(*s[lo : hi + 1]),) + s[hi + 1 :]


def _concat(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    rank = len(ins[0])
    ax = _axis(attrs["axis"], rank)
    total = ins[0][ax]
    for s in ins[1:]:
        if len(s) != rank or s[:ax] + s[ax + 1 :] != ins[0][:ax] + ins[0][ax + 1 :]:
            _fail(f"concat along axis {ax}: {list(ins[0])} and {list(s)} differ off the axis")
        total = concat_plan(total, s[ax])["out"]
    return ins[0][:ax] + (total,) + ins[0][ax + 1 :]


def _permute(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s, perm = ins[0], tuple(attrs["perm"])
    if sorted(perm) != list(range(len(s))):
        _fail(f"perm {list(perm)} is not a permutation of the axes of {list(s)}")
    return tuple(s[p] for p in perm)


def _transpose(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = list(ins[0])
    a, b = _axis(attrs["dim0"], len(s), "dim0"), _axis(attrs["dim1"], len(s), "dim1")
    s[a], s[b] = s[b], s[a]
    return tuple(s)


def _broadcast_to(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    src, dst = ins[0], _check_numel(tuple(attrs["shape"]))
    if len(src) > len(dst):
        _fail(f"cannot broadcast {list(src)} to the lower rank {list(dst)}")
    for s, d in zip(src, dst[len(dst) - len(src) :], strict=True):
        if not broadcast_plan(s, d)["ok"]:
            _fail(f"cannot broadcast {list(src)} to {list(dst)}: dimension {s} vs {d}")
    return dst


def _expand(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    src, want = ins[0], tuple(attrs["shape"])
    if len(src) > len(want):
        _fail(f"cannot expand {list(src)} to the lower rank {list(want)}")
    lead = len(want) - len(src)
    if any(w == -1 for w in want[:lead]):
        _fail(f"expand {list(want)}: -1 only for existing axes of {list(src)}")
    target = tuple(src[i - lead] if w == -1 else w for i, w in enumerate(want))
    return _broadcast_to(ins, {"shape": target}, declared)


def _reduce(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = ins[0]
    ax = _axis(attrs["axis"], len(s))
    return s[:ax] + ((1,) if attrs["keepdim"] else ()) + s[ax + 1 :]


def _sum_all(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    return ()


def _linear(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = ins[0]
    if not s:
        _fail("linear needs an input of rank >= 1, got a scalar []")
    if attrs["out_features"] < 0:
        _fail(f"out_features {attrs['out_features']} < 0")
    return s[:-1] + (attrs["out_features"],)


def _matmul(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    a, b = ins
    if len(a) < 2 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2]:
        _fail(f"matmul needs (..., m, k) @ (..., k, n) with equal batch dims: {list(a)} @ {list(b)}")
    return a[:-1] + (b[-1],)


def _bmm(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    if len(ins[0]) != 3:
        _fail(f"bmm needs rank-3 operands: {list(ins[0])} @ {list(ins[1])}")
    return _matmul(ins, attrs, declared)


def _spatial(ins: tuple[Shape, ...], what: str) -> Shape:
    s = ins[0]
    if len(s) not in (3, 4):
        _fail(f"{what} needs (C, H, W) or (N, C, H, W), got {list(s)}")
    return s


def _pair(v: Any, what: str = "attribute") -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    if len(v) != 2:
        _fail(f"{what} {list(v)} must be one int or two (height, width): the op is 2-d")
    return (v[0], v[1])


def _conv2d(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = _spatial(ins, "conv2d")
    k, st, p, d = (_pair(attrs[n], n) for n in ("kernel", "stride", "padding", "dilation"))
    hw = []
    for i in range(2):
        plan = conv_plan(s[-2 + i], k[i], st[i], p[i], d[i])
        if not plan["valid"]:
            _fail(
                f"conv2d window (kernel {k[i]}, stride {st[i]}, padding {p[i]}, dilation {d[i]}) does not fit "
                f"spatial size {s[-2 + i]} of {list(s)}"
            )
        hw.append(plan["out"])
    return s[:-3] + (attrs["out_channels"], hw[0], hw[1])


def _pool(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = _spatial(ins, "pool")
    k, st, p = (_pair(attrs[n], n) for n in ("kernel", "stride", "padding"))
    hw = []
    for i in range(2):
        plan = pool_plan(s[-2 + i], k[i], st[i], p[i])
        if not plan["valid"] and 2 * p[i] > k[i]:
            _fail(
                f"pool padding {p[i]} is more than half the kernel {k[i]} (the rule: 2 * padding <= kernel) on "
                f"spatial axis {i} of {list(s)}"
            )
        if not plan["valid"]:
            _fail(
                f"pool window (kernel {k[i]}, stride {st[i]}, padding {p[i]}) does not fit spatial size "
                f"{s[-2 + i]} of {list(s)}"
            )
        hw.append(plan["out"])
    return s[:-2] + (hw[0], hw[1])


def _last_axis(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    if not ins[0]:
        _fail("needs an input of rank >= 1, got a scalar []")
    return ins[0]


def _softmax(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    _axis(attrs["axis"], len(ins[0]))
    return ins[0]


def _slice(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = ins[0]
    ax = _axis(attrs["axis"], len(s))
    plan = slice_plan(s[ax], attrs["start"], attrs["stop"], attrs["step"])
    if not plan["valid"]:
        _fail(f"slice [{attrs['start']}:{attrs['stop']}:{attrs['step']}] outside axis {ax} of {list(s)}")
    return s[:ax] + (plan["out"],) + s[ax + 1 :]


def _embedding(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    return ins[0] + (attrs["dim"],)


def _rope(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    s = ins[0]
    if len(s) < 2 or s[-1] % 2:
        _fail(f"rope needs (..., T, D) with D even, got {list(s)}")
    return s


def _attention(ins: tuple[Shape, ...], attrs: Mapping[str, Any], declared: Shape) -> Shape:
    q, k, v = ins[:3]
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        _fail(f"attention needs q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D): got q {list(q)}, k {list(k)}, v {list(v)}")
    if k != v or q[0] != k[0] or q[3] != k[3]:
        _fail(
            f"attention: k and v must both be (B, Hkv, Lk, D) with q's B and D: got q {list(q)}, k {list(k)}, "
            f"v {list(v)}"
        )
    b, hq, lq, d = q
    hkv, lk = k[1], k[2]
    if not attention_plan(b, hq, hkv, lq, lk, d)["valid"]:
        # The plan decides; these name which of its conditions fails.
        why = [
            msg
            for bad, msg in (
                (hkv < 1 or hq < hkv or hq % max(hkv, 1), f"heads_q {hq} is not a positive multiple of heads_kv {hkv}"),
                (not 1 <= d <= ATTENTION_HEAD_DIM_MAX, f"head dim {d} is not in 1..{ATTENTION_HEAD_DIM_MAX}"),
                (b < 1, f"batch {b} < 1"),
                (b * hq > ATTENTION_GRID_Y_MAX, f"batch * heads_q = {b * hq} > {ATTENTION_GRID_Y_MAX}"),
            )
            if bad
        ]
        _fail(f"attention (q {list(q)}, k {list(k)}): {'; '.join(why) or 'shapes outside the attention plan'}")
    if len(ins) == 4 and ins[3] != (b,):
        _fail(f"attention: the kv_lens operand must have shape [{b}] (one key length per batch), got {list(ins[3])}")
    return q


# -- the registry -----------------------------------------------------------------------------------------

_A = AttrSpec
_KEEP = (_A("axis", "int"), _A("keepdim", "bool", False))
_WIN = (_A("kernel", "ints"), _A("stride", "ints", (1, 1)), _A("padding", "ints", (0, 0)))
_EXACT = "softfloat, env cuda (round to nearest even, subnormals kept, NaN results 0x7FFFFFFF)"
_APPROX = "the real function evaluated in float64, rounded once to binary32 (RNE); NaN results 0x7FFFFFFF"
_MOVE = "data movement: every output element is a bit-exact copy of one input element"

for _op in (
    # structural
    OpKind("input", 0, "structural", _declared, "the i-th input array (inputs in id order), shape checked"),
    OpKind("const", 0, "structural", _declared, "payload[id].value (float32 of the declared shape)", payload="const"),
    OpKind("reshape", 1, "structural", _reshape, f"row-major reshape; {_MOVE}", (_A("shape", "ints"),)),
    OpKind(
        "flatten",
        1,
        "structural",
        _flatten,
        f"merge axes start..end (torch.flatten); {_MOVE}",
        (_A("start", "int", 0), _A("end", "int", -1)),
    ),
    OpKind(
        "concat",
        None,
        "structural",
        _concat,
        f"concatenate the parents in order along axis; {_MOVE}",
        (_A("axis", "int"),),
    ),
    OpKind(
        "permute",
        1,
        "structural",
        _permute,
        f"out axes are in axes perm[0], perm[1], ...; {_MOVE}",
        (_A("perm", "ints"),),
    ),
    OpKind(
        "transpose",
        1,
        "structural",
        _transpose,
        f"swap axes dim0 and dim1; {_MOVE}",
        (_A("dim0", "int"), _A("dim1", "int")),
    ),
    OpKind(
        "slice",
        1,
        "structural",
        _slice,
        f"x[start:stop:step] along axis (0 <= start <= stop <= dim); {_MOVE}",
        (_A("axis", "int"), _A("start", "int"), _A("stop", "int"), _A("step", "int", 1)),
    ),
    OpKind(
        "broadcastTo", 1, "broadcast", _broadcast_to, f"NumPy broadcasting to shape; {_MOVE}", (_A("shape", "ints"),)
    ),
    OpKind(
        "expand",
        1,
        "broadcast",
        _expand,
        f"broadcastTo with -1 keeping an existing axis (torch.expand); {_MOVE}",
        (_A("shape", "ints"),),
    ),
    # elementwise, exact (softfloat)
    OpKind("add", 2, "elementwise", _same, f"a + b, equal shapes; {_EXACT}"),
    OpKind("sub", 2, "elementwise", _same, f"a - b, equal shapes; {_EXACT}"),
    OpKind("mul_elem", 2, "elementwise", _same, f"a * b, equal shapes; {_EXACT}"),
    OpKind("div", 2, "elementwise", _same, f"a / b, equal shapes; {_EXACT}"),
    OpKind(
        "maxElem",
        2,
        "elementwise",
        _same,
        "C fmaxf(a, b): a NaN operand is dropped (NaN only if both are NaN); the reduction max propagates NaN",
    ),
    OpKind("minElem", 2, "elementwise", _same, "C fminf(a, b): a NaN operand is dropped (NaN only if both are NaN)"),
    OpKind("sqrt", 1, "elementwise", _same, f"correctly rounded sqrt; {_EXACT}"),
    OpKind("inv", 1, "elementwise", _same, f"1 / x, one rounding; {_EXACT}"),
    OpKind("neg", 1, "elementwise", _same, "sign-bit flip (NaN payload kept)"),
    OpKind("abs", 1, "elementwise", _same, "sign-bit clear (NaN payload kept)"),
    OpKind("relu", 1, "elementwise", _same, "x if x > 0 else +0; NaN -> 0x7FFFFFFF (spec.elementwise relu)"),
    # elementwise, real function rounded once
    OpKind("pow", 2, "elementwise", _same, f"a ** b (C pow); {_APPROX}"),
    OpKind("rsqrt", 1, "elementwise", _same, f"1 / sqrt(x); {_APPROX}"),
    OpKind("exp", 1, "elementwise", _same, f"e^x; {_APPROX}"),
    OpKind("log", 1, "elementwise", _same, f"ln x; {_APPROX}"),
    OpKind("sin", 1, "elementwise", _same, f"sin x; {_APPROX}"),
    OpKind("cos", 1, "elementwise", _same, f"cos x; {_APPROX}"),
    OpKind("tanh", 1, "elementwise", _same, f"tanh x; {_APPROX}"),
    OpKind("sigmoid", 1, "elementwise", _same, f"1 / (1 + e^-x); {_APPROX}"),
    OpKind("silu", 1, "elementwise", _same, f"x / (1 + e^-x); {_APPROX}"),
    OpKind("gelu", 1, "elementwise", _same, f"tanh-approximation GELU (spec.elementwise); {_APPROX}"),
    OpKind("erf", 1, "elementwise", _same, f"the error function erf x (C erf); {_APPROX}"),
    OpKind(
        "where",
        3,
        "elementwise",
        _same,
        "a where cond != 0 else b (cond, a, b of equal shapes; a NaN cond counts as nonzero): a bit copy of one "
        "operand per element (ONNX Where with a float 0/1 condition)",
    ),
    # reductions
    OpKind(
        "reduceSum",
        1,
        "reduction",
        _reduce,
        "left fold of binary32 adds along axis from +0, in index order (spec.reductions.fold_left)",
        _KEEP,
    ),
    OpKind(
        "reduceMean",
        1,
        "reduction",
        _reduce,
        "fold_left sum along axis, then one rounded division by float32(length) (spec.reductions.mean_of)",
        _KEEP,
    ),
    OpKind("sum", 1, "reduction", _sum_all, "left fold from +0 over every element in row-major order; shape []"),
    # neural-network ops
    OpKind(
        "linear",
        1,
        "nn",
        _linear,
        "y[o] = fold_k(+0, W[o,k]*x[k]) + b[o]: products and adds each rounded, k ascending, bias added last; "
        "W, b = payload[id]",
        (_A("out_features", "int"),),
        payload="linear",
    ),
    OpKind(
        "matmul",
        2,
        "nn",
        _matmul,
        "C[m,n] = fold_k(+0, A[m,k]*B[k,n]), products and adds each rounded, k ascending; batch dims equal",
    ),
    OpKind("bmm", 2, "nn", _bmm, "matmul over rank-3 operands (b, m, k) @ (b, k, n)"),
    OpKind(
        "conv2d",
        1,
        "nn",
        _conv2d,
        "zero-padded input; y[co,i,j] = fold over (ci, ki, kj) row-major from +0 of w*x (each rounded), "
        "then + b[co]; groups 1; W, b = payload[id]",
        (
            _A("out_channels", "int"),
            _A("kernel", "ints"),
            _A("stride", "ints", (1, 1)),
            _A("padding", "ints", (0, 0)),
            _A("dilation", "ints", (1, 1)),
        ),
        payload="conv2d",
    ),
    OpKind(
        "pool",
        1,
        "nn",
        _pool,
        "max: IEEE maximum fold (NaN propagates) from -Inf over the window row-major, padding -Inf; avg: "
        "fold sum from +0 over the window (padding +0 counted), then / float32(kh*kw)",
        (_A("mode", "str", "max", ("max", "avg")),) + _WIN,
    ),
    OpKind(
        "softmax",
        1,
        "nn",
        _softmax,
        "m = IEEE max fold along axis; e = exp(x - m) (sub rounded, exp rounded once); s = fold_left(e); "
        "y = e / s (rounded)",
        (_A("axis", "int", -1),),
    ),
    OpKind(
        "layernorm",
        1,
        "nn",
        _last_axis,
        "last axis, n its length: mu = fold(x)/n; d = x - mu; var = fold(d*d)/n; r = rsqrt(var + eps) "
        "(real, rounded once); y = (d*r)*w + b, each op rounded; w, b = payload[id]",
        (_A("eps", "float", 1e-5),),
        payload="norm",
    ),
    OpKind(
        "rmsnorm",
        1,
        "nn",
        _last_axis,
        "last axis: ms = fold(x*x)/n; r = rsqrt(ms + eps) (rounded once); y = (x*r)*w, each op rounded; "
        "w = payload[id]",
        (_A("eps", "float", 1e-6),),
        payload="rmsnorm",
    ),
    OpKind(
        "attention",
        (3, 4),
        "nn",
        _attention,
        "softmax(q k^T * scale + mask) v over q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D): query head h reads KV "
        "head h // (Hq / Hkv) (GQA/MQA); scale = attr or 1/sqrt(D); key j allowed for row i iff j < kv_lens[b] "
        "(optional 4th operand (B,), integers in [0, Lk]) and, if causal, j <= i; blocked keys weigh exactly 0, a "
        "row with none allowed is +0. The family has only a float64 spec: spec.attention.sdpa in float64, rounded "
        "once to binary32 (RNE), NaN 0x7FFFFFFF; kernels agree within spec.attention.forward_bound, not bitwise",
        (_A("causal", "bool", False), _A("scale", "float", None)),
    ),
    OpKind(
        "embedding",
        1,
        "nn",
        _embedding,
        "y[..., :] = table[int(x[...]), :] (bit copy); every index must be an integer in [0, V)",
        (_A("dim", "int"),),
        payload="embedding",
    ),
    OpKind(
        "rope",
        1,
        "nn",
        _rope,
        "x (..., T, D): pairs (x[2i], x[2i+1]) at position t rotate by theta = t * base^(-2i/D); c, s = "
        "cos/sin(theta) in float64 rounded once; y0 = x0*c - x1*s, y1 = x0*s + x1*c, each op rounded",
        (_A("base", "float", 10000.0),),
    ),
    # explicit randomness (SplitMix64, spec.rng)
    OpKind(
        "randUniform",
        0,
        "random",
        _declared,
        "element i (row-major) = spec.rng uniform of low32(splitmix64(key(seed, counter) + i)), in [0, 1)",
        (_A("seed", "uint64"), _A("counter", "uint64", 0)),
    ),
    OpKind(
        "bernoulliMask",
        0,
        "random",
        _declared,
        "1.0 where keep_prob > uniform(seed, counter, i) else +0 (spec.rng mask_reference)",
        (_A("seed", "uint64"), _A("counter", "uint64", 0), _A("keep_prob", "float", 0.5)),
    ),
):
    register_op(_op)
