"""Deterministic RNG kernels (SplitMix64 keyed by seed and counter): CUDA via NVRTC and a NumPy host path.

Element ``i`` (row-major linear index) of a call with ``draws`` words per element reads the words
``low32(splitmix64(key + plan.draw_offset(i, j)))``, ``j < draws``, ``key = splitmix64(seed + counter)``.
SplitMix64 is uint64 wrap-around by design (NumPy uint64 / CUDA ``unsigned long long``); the index
arithmetic around it comes from :func:`rng_plan`, which the checker proves free of overflow for tensors
of up to 2^40 elements (contracts/rng-splitmix64-v1.yaml).

Outputs (one kernel, a ``mode`` argument): raw ``bits``; ``uniform`` in [0, 1) as ``(u >> 8) * 2^-24``
(exact in binary32, at most ``1 - 2^-24``); ``mask`` = ``keep_prob > uniform``; inverted ``dropout``
``(x * mask) / keep_prob``; Box-Muller ``normal`` evaluated in binary64 with pinned operations and rounded
once to binary32. The uniform map as a function of the raw word is modelled in integers by
:func:`uniform_map_plan` (the enumerated "uniform < 1" obligation) and the kernel is checked against that
model over all 2^24 distinct inputs.

Kernels are compiled through the project's NVRTC route ``nvrtc-ieee`` (-ftz=false -fmad=false, IEEE
div/sqrt), never CuPy's stock route, which appends -ftz=true. Planted-bug builds are :data:`VARIANTS`
entries selected with ``variant=`` (tests only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from native.nvrtc import INDEX_TYPES, compile_function, get_route
from obligations.core.device import array_module, resolve_device, to_host
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import as_type, cdiv, select, smax, smin

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_MAX_GRID",
    "ROUTE",
    "MODES",
    "RngPlan",
    "rng_plan",
    "uniform_map_plan",
    "design_uniform_map_plan",
    "RngVariant",
    "VARIANTS",
    "get_variant",
    "stream_key",
    "generate",
    "uniform_map",
    "kernel_source",
    "bits",
    "uniform",
    "bernoulli_mask",
    "normal",
    "dropout",
    "route_evidence",
    "INIT_SOURCE",
    "fill",
    "payload",
    "init_uniform",
    "xavier_bound",
    "kaiming_bound",
    "xavier_uniform",
    "kaiming_uniform",
]

DEFAULT_BLOCK = 256
DEFAULT_MAX_GRID = 65536
ROUTE = "nvrtc-ieee"  # no ftz, no contraction: the pinned binary64 normal and binary32 dropout need both
# mode -> (code passed to the kernel, words drawn per element)
MODES: dict[str, tuple[int, int]] = {
    "bits": (0, 1),
    "uniform": (1, 1),
    "mask": (2, 1),
    "dropout": (3, 1),
    "normal": (4, 2),
}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TWO_PI = 6.283185307179586  # fl64(2 pi)


# -- the launch/index plan (ints at launch time, checker terms in `kc check`) -------------------------


@dataclass(frozen=True)
class RngPlan:
    """Launch geometry and counter layout of one RNG call over ``n_elems`` elements."""

    n_elems: Any
    draws: Any
    n_draws: Any
    block: Any
    grid: Any
    stride: Any
    iterations: Any
    max_grid: Any
    index_bits: int = 64  # the kernel's grid-stride index type (the source reads it from here)

    def draw_offset(self, i: Any, j: Any) -> Any:
        """Counter offset from the key of word ``j`` of element ``i``: i * draws + j (2i, 2i + 1 for normal)."""
        return i * self.draws + j

    def next_index(self, i: Any) -> Any:
        """The grid-stride loop's next index after ``i``, in the kernel's index type."""
        index_type = "int64" if self.index_bits == 64 else "int32"
        return as_type(i, index_type) + as_type(self.stride, index_type)

    def regimes(self) -> dict[str, Any]:
        """The kernel's paths: no element, one trip per thread, a grid-stride loop (the mode picks the words)."""
        n, trips = self.n_elems, self.iterations
        return {"empty": n == 0, "one_trip": (n > 0) & (trips <= 1), "grid_stride": trips > 1}


def rng_plan(n_elems: Any, draws: Any, block: Any = DEFAULT_BLOCK, max_grid: Any = DEFAULT_MAX_GRID) -> RngPlan:
    """The plan of an RNG call: grid-stride launch over n_elems and n_elems * draws counter offsets."""
    grid = smin(smax(cdiv(n_elems, block), 1), max_grid)  # >= 1 block even for n == 0 (the guard no-ops)
    stride = grid * block
    return RngPlan(n_elems, draws, n_elems * draws, block, grid, stride, cdiv(n_elems, stride), max_grid)


def _u24_bits(u24: Any) -> Any:
    """binary32 bits of u24 * 2^-24 for 0 <= u24 < 2^24, in integers: exponent from the leading bit."""
    e: Any = 0
    scale: Any = 1 << 23  # 2^(23 - e): shifts the leading bit to the hidden-bit position
    for k in range(1, 24):  # select chain, not a loop on data: the checker evaluates every branch
        ge = u24 >= (1 << k)
        e = select(ge, k, e)
        scale = select(ge, 1 << (23 - k), scale)
    return select(u24 == 0, 0, (e + 103) * (1 << 23) + (u24 * scale - (1 << 23)))


def uniform_map_plan(u: Any) -> dict:
    """Integer model of the kernel's uniform map: binary32 bits of (u >> 8) * 2^-24 for a raw uint32 word."""
    u24 = as_type(u, "int64") // 256
    return {"u24": u24, "uniform_bits": _u24_bits(u24)}


def design_uniform_map_plan(u: Any) -> dict:
    """Integer model of the kernel-families design: binary32 round-to-nearest-even of u * 2^-32."""
    x = as_type(u, "int64")
    e: Any = 0
    for k in range(1, 32):
        e = select(x >= (1 << k), k, e)
    # Keep 24 significant bits: exact left shift for e <= 23, else divide by 2^(e-23) and round to even.
    lshift: Any = 1 << 23
    rshift: Any = 1
    for k in range(1, 32):
        lshift = select(e == k, 1 << max(23 - k, 0), lshift)
        rshift = select(e == k, 1 << max(k - 23, 0), rshift)
    q = x // rshift
    r = x % rshift
    half = rshift // 2
    up = select(rshift > 1, select(r > half, 1, select(r == half, q % 2, 0)), 0)
    sig = select(e <= 23, x * lshift, q + up)  # in [2^23, 2^24]; 2^24 carries into the exponent below
    bits = (e + 95) * (1 << 23) + (sig - (1 << 23))
    return {"u24": x // 256, "uniform_bits": select(x == 0, 0, bits)}


# -- variants (planted bugs for the project's own tests) ------------------------------------------------


@dataclass(frozen=True)
class RngVariant:
    """A build of the RNG kernel: the counter offset adjustment and the uniform map it uses."""

    name: str
    offset_adjust: int = 0  # words are drawn at key + draw_offset(i, j) + offset_adjust
    uniform: str = "u24"  # "u24": (u >> 8) * 2^-24; "design": binary32 rounding of u * 2^-32
    doc: str = ""


VARIANTS: dict[str, RngVariant] = {
    v.name: v
    for v in (
        RngVariant("default", doc="the shipped kernel"),
        RngVariant("index_off_by_one", offset_adjust=1, doc="planted: element i reads the counter of i + 1"),
        RngVariant("uniform_design", uniform="design", doc="kernel-families design: can return exactly 1.0"),
    )
}

# uniform map name -> (CUDA expression of `u`, NumPy implementation on a uint32 array)
_UNIFORM_MAPS: dict[str, tuple[str, Any]] = {
    # u >> 8 < 2^24 converts exactly; the product by 2^-24 only changes the exponent: exact, < 1.
    "u24": (
        "__fmul_rn(__uint2float_rn(u >> 8), 5.9604644775390625e-08f)",
        lambda u: (u >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24),
    ),
    # uint32 -> binary32 rounds to nearest even (x86 cvtsi2ss, PTX cvt.rn); 2^-32 scaling is exact.
    "design": (
        "__fmul_rn(__uint2float_rn(u), 2.3283064365386963e-10f)",
        lambda u: u.astype(np.float32) * np.float32(2.0**-32),
    ),
}


def get_variant(name: str | None) -> RngVariant:
    """The named variant (None means "default"); KeyError lists the known ones."""
    try:
        return VARIANTS[name or "default"]
    except KeyError:
        raise KeyError(f"unknown RNG variant {name!r}; known: {sorted(VARIANTS)}") from None


# -- host path --------------------------------------------------------------------------------------


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 on a uint64 array (NumPy array arithmetic wraps modulo 2^64 silently)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, counter: int) -> int:
    """splitmix64((seed + counter) mod 2^64): the key of one RNG call."""
    x = np.array([(int(seed) + int(counter)) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    return int(_splitmix64(x)[0])


def _host_words(key: int, n: int, draws: int, j: int, v: RngVariant) -> np.ndarray:
    plan = rng_plan(n, draws)
    offsets = plan.draw_offset(np.arange(n, dtype=np.uint64), np.uint64(j)) + np.uint64(v.offset_adjust)
    return (_splitmix64(np.uint64(key) + offsets) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _host_normal(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    u1 = (r1.astype(np.float64) + 1.0) / 4294967297.0
    t = _TWO_PI * (r2.astype(np.float64) * 2.0**-32)
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(t)).astype(np.float32)


def _host(mode: str, key: int, n: int, v: RngVariant, keep_prob: np.float32, x: np.ndarray | None) -> np.ndarray:
    draws = MODES[mode][1]
    u = _host_words(key, n, draws, 0, v)
    if mode == "bits":
        return u
    if mode == "normal":
        return _host_normal(u, _host_words(key, n, draws, 1, v)).view(np.uint32)
    f = _UNIFORM_MAPS[v.uniform][1](u)
    if mode == "uniform":
        return f.view(np.uint32)
    m = keep_prob > f
    if mode == "mask":
        return m.astype(np.uint32)
    with np.errstate(all="ignore"):
        y = (x * m.astype(np.float32)) / keep_prob
    # CUDA writes every NaN result as 0x7FFFFFFF (float-facts.md); the host follows that rule bit for bit.
    return np.where(np.isnan(y), np.uint32(0x7FFFFFFF), y.view(np.uint32)).astype(np.uint32)


# -- CUDA path ----------------------------------------------------------------------------------------

_SOURCE = """\
typedef unsigned long long kc_u64;
typedef unsigned int kc_u32;
__device__ __forceinline__ kc_u64 kc_splitmix64(kc_u64 x) {{
    kc_u64 z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}}
__device__ __forceinline__ float kc_u01(kc_u32 u) {{ return {uniform}; }}
__device__ __forceinline__ kc_u32 kc_word(kc_u64 key, long long i, long long draws, long long j) {{
    // draw_offset(i, j) = i * draws + j: proved below 2^41 in int64 for n <= 2^40 (RNG-INDEX-z3).
    return (kc_u32)kc_splitmix64(key + (kc_u64)(i * draws + j) + {adjust}ULL);
}}
extern "C" __global__ void {fname}(kc_u64 key, long long n, int mode, float keep_prob,
                                    const float* __restrict__ x, kc_u32* __restrict__ out) {{
    const long long draws = (mode == 4) ? 2 : 1;
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += ({idx})blockDim.x * gridDim.x) {{
        kc_u32 u = kc_word(key, i, draws, 0);
        kc_u32 r;
        if (mode == 0) {{
            r = u;
        }} else if (mode == 4) {{
            kc_u32 u2 = kc_word(key, i, draws, 1);
            // Pinned binary64 operations, the same sequence as the host path; log and cos are CUDA's
            // double-precision functions (1 and 2 ulp), so host and device agree to 1 binary32 ulp.
            double u1 = __ddiv_rn(__dadd_rn((double)u, 1.0), 4294967297.0);
            double t = __dmul_rn(6.283185307179586, __dmul_rn((double)u2, 2.3283064365386963e-10));
            double z = __dmul_rn(__dsqrt_rn(__dmul_rn(-2.0, log(u1))), cos(t));
            r = __float_as_uint(__double2float_rn(z));
        }} else {{
            float f = kc_u01(u);
            if (mode == 1) {{
                r = __float_as_uint(f);
            }} else {{
                bool keep = keep_prob > f;
                if (mode == 2) {{
                    r = keep ? 1u : 0u;
                }} else {{
                    r = __float_as_uint(__fdiv_rn(__fmul_rn(x[i], keep ? 1.0f : 0.0f), keep_prob));
                }}
            }}
        }}
        out[i] = r;
    }}
}}
extern "C" __global__ void {fname}_umap(const kc_u32* __restrict__ in, kc_u32* __restrict__ out, long long n) {{
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += ({idx})blockDim.x * gridDim.x) {{
        out[i] = __float_as_uint(kc_u01(in[i]));
    }}
}}
"""


def kernel_source(variant: str | None = None, plan: RngPlan | None = None) -> tuple[str, str]:
    """(CUDA source, kernel name) of the RNG kernel built as ``variant``; ``name + '_umap'`` is the map kernel.

    The loop index type is the plan's (``index_bits``), never written a second time in the source.
    """
    v = get_variant(variant)
    plan = plan if plan is not None else rng_plan(1, 1)
    fname = "kc_rng" + ("" if v.name == "default" else f"_{v.name}")
    src = _SOURCE.format(
        fname=fname, uniform=_UNIFORM_MAPS[v.uniform][0], adjust=v.offset_adjust, idx=INDEX_TYPES[int(plan.index_bits)]
    )
    return src, fname


def _launch(n: int, block: int = DEFAULT_BLOCK, max_grid: int = DEFAULT_MAX_GRID) -> tuple[int, int]:
    plan = rng_plan(n, 1, block, max_grid)
    return int(plan.grid), int(plan.block)


def _cuda(
    mode: str,
    key: int,
    n: int,
    variant: str | None,
    keep_prob: np.float32,
    x: Any,
    block: int = DEFAULT_BLOCK,
    max_grid: int = DEFAULT_MAX_GRID,
) -> Any:
    import cupy

    src, fname = kernel_source(variant)
    fn = compile_function(src, fname, ROUTE)
    out = cupy.empty(n, dtype=cupy.uint32)
    xs = cupy.ascontiguousarray(x, dtype=cupy.float32).reshape(-1) if x is not None else cupy.empty(1, cupy.float32)
    grid, block = _launch(n, block, max_grid)
    fn((grid,), (block,), (np.uint64(key), np.int64(n), np.int32(MODES[mode][0]), keep_prob, xs, out))
    return out


# -- public entry points --------------------------------------------------------------------------------


def _check_keep_prob(keep_prob: float) -> np.float32:
    p = np.float32(keep_prob)
    if not 0.0 < float(p) <= 1.0:
        raise ValueError(f"keep_prob must be in (0, 1] as binary32, got {keep_prob!r}")
    return p


@entry_point("rng", axes={"mode": tuple(MODES), "variant": (None,)})
def generate(
    mode: str,
    shape: tuple[int, ...] | int,
    seed: int,
    counter: int,
    *,
    device: str = "host",
    keep_prob: float = 1.0,
    x: Any = None,
    variant: str | None = None,
    block: int = DEFAULT_BLOCK,
    max_grid: int = DEFAULT_MAX_GRID,
) -> Any:
    """Run the RNG kernel in ``mode`` (launched with the plan's knobs) and return uint32 bits in ``shape``."""
    if mode not in MODES:
        raise KeyError(f"unknown RNG mode {mode!r}; known: {sorted(MODES)}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = int(np.prod(shape, dtype=np.int64))
    if n > 1 << 40:
        raise ValueError(f"{n} elements: the RNG plan is proved for at most 2^40 elements")
    p = _check_keep_prob(keep_prob) if mode in ("mask", "dropout") else np.float32(1.0)
    dev = resolve_device(device)
    key = stream_key(seed, counter)
    if mode == "dropout":
        if x is None or tuple(x.shape) != shape:
            raise ValueError("dropout needs x of the requested shape")
    if dev == "host":
        xs = None if x is None else np.ascontiguousarray(to_host(x), dtype=np.float32).reshape(-1)
        out = _host(mode, key, n, get_variant(variant), p, xs)
    else:
        out = _cuda(mode, key, n, variant, p, x, block, max_grid)
    return out.reshape(shape)


@entry_point("rng", axes={"variant": (None,)})
def uniform_map(words: Any, *, device: str = "host", variant: str | None = None) -> Any:
    """uint32 bits of the kernel's uniform map applied to raw words (the device code the RNG kernel uses)."""
    dev = resolve_device(device)
    v = get_variant(variant)
    if dev == "host":
        return _UNIFORM_MAPS[v.uniform][1](np.asarray(words, dtype=np.uint32)).view(np.uint32)
    import cupy

    src, fname = kernel_source(variant)
    fn = compile_function(src, fname + "_umap", ROUTE)
    w = cupy.ascontiguousarray(words, dtype=cupy.uint32).reshape(-1)
    out = cupy.empty_like(w)
    grid, block = _launch(int(w.size))
    fn((grid,), (block,), (w, out, np.int64(w.size)))
    return out


def bits(shape: Any, seed: int, counter: int = 0, *, device: str = "auto") -> Any:
    """Raw uint32 words: low32(splitmix64(key + i)) at row-major index i."""
    return generate("bits", shape, seed, counter, device=device)


def uniform(shape: Any, seed: int, counter: int = 0, *, device: str = "auto") -> Any:
    """float32 uniforms in [0, 1): (u >> 8) * 2^-24."""
    xp = array_module(resolve_device(device))
    return generate("uniform", shape, seed, counter, device=device).view(xp.float32)


def bernoulli_mask(shape: Any, keep_prob: float, seed: int, counter: int = 0, *, device: str = "auto") -> Any:
    """bool mask: keep_prob > uniform (keep_prob = 1 keeps every element)."""
    return generate("mask", shape, seed, counter, device=device, keep_prob=keep_prob) != 0


def normal(shape: Any, seed: int, counter: int = 0, *, device: str = "auto") -> Any:
    """float32 standard normals by Box-Muller from words 2i and 2i + 1 (binary64, rounded once)."""
    xp = array_module(resolve_device(device))
    return generate("normal", shape, seed, counter, device=device).view(xp.float32)


def dropout(x: Any, keep_prob: float, seed: int, counter: int = 0, *, device: str = "auto") -> Any:
    """Inverted dropout (x * mask) / keep_prob in binary32 with the mask of (seed, counter)."""
    xp = array_module(resolve_device(device))
    return generate("dropout", tuple(x.shape), seed, counter, device=device, keep_prob=keep_prob, x=x).view(xp.float32)


def route_evidence() -> dict:
    """The compile route the CUDA kernels use, as JSON evidence."""
    return get_route(ROUTE).to_json()


# -- device-side initializers (MK-41..MK-46) -------------------------------------------------------------------

INIT_SOURCE = """\
extern "C" __global__ void kc_init_fill(unsigned* __restrict__ out, long long n, unsigned bits) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        out[i] = bits;
}
extern "C" __global__ void kc_init_symmetric(const float* __restrict__ u, float* __restrict__ out, long long n,
                                             float bound) {
    // s = 2u - 1 is exact (u = k 2^-24, |2k - 2^24| < 2^24); w = fl(bound * s) is the only rounding.
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        out[i] = __fmul_rn(bound, __fsub_rn(__fmul_rn(2.0f, u[i]), 1.0f));
}
"""


def _init_launch(name: str, n: int, args: tuple) -> None:
    if n:
        grid, block = _launch(n)
        compile_function(INIT_SOURCE, name, ROUTE)((grid,), (block,), args)


@entry_point("rng")
def fill(shape: Any, value: float, *, device: str = "auto") -> Any:
    """float32 ``shape`` filled with float32(``value``)'s bits on the device (zeros: 0.0, ones: 1.0; MK-41, MK-42)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dev = resolve_device(device)
    xp = array_module(dev)
    bits = np.asarray(value, dtype=np.float32).reshape(()).view(np.uint32)
    n = int(np.prod(shape, dtype=np.int64))
    if dev == "host":
        return np.full(shape, bits, dtype=np.uint32).view(np.float32)
    out = xp.empty(n, dtype=xp.uint32)
    _init_launch("kc_init_fill", n, (out, np.int64(n), np.uint32(bits)))
    return out.view(xp.float32).reshape(shape)


@entry_point("rng")
def payload(values: Any, *, device: str = "auto") -> Any:
    """The exact float32 payload on the device: every bit pattern kept (NaN payloads, subnormals, -0; MK-46)."""
    dev = resolve_device(device)
    host = np.ascontiguousarray(to_host(values))
    if host.dtype != np.float32:
        raise TypeError(f"payload takes float32 values (their bits are the payload), not {host.dtype}")
    if dev == "host":
        return host.copy()
    return array_module(dev).asarray(host)  # a host-to-device memcpy: bits, not values


@entry_point("rng")
def init_uniform(shape: Any, bound: float, seed: int, counter: int = 0, *, device: str = "auto") -> Any:
    """Uniform in [-b, b], b = float32(bound): w = fl(b * (2u - 1)) with u the stream's uniform (MK-43)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    b = np.float32(bound)
    if not (np.isfinite(b) and b >= 0):
        raise ValueError(f"bound must be finite and >= 0 as binary32, got {bound!r}")
    dev = resolve_device(device)
    xp = array_module(dev)
    u = uniform(shape, seed, counter, device=dev).reshape(-1)
    if dev == "host":
        return (b * ((np.float32(2) * u) - np.float32(1))).astype(np.float32).reshape(shape)
    out = xp.empty(u.size, dtype=xp.float32)
    _init_launch("kc_init_symmetric", int(u.size), (u, out, np.int64(u.size), b))
    return out.reshape(shape)


def xavier_bound(fan_in: int, fan_out: int, gain: float = 1.0) -> np.float32:
    """Glorot's uniform bound float32(gain sqrt(6 / (fan_in + fan_out))) (binary64, rounded once more)."""
    return np.float32(gain * np.sqrt(6.0 / (fan_in + fan_out)))


def kaiming_bound(fan_in: int, gain: float = float(np.sqrt(2.0))) -> np.float32:
    """He's uniform bound float32(gain sqrt(3 / fan_in)) (gain sqrt(2): ReLU)."""
    return np.float32(gain * np.sqrt(3.0 / fan_in))


@entry_point("rng")
def xavier_uniform(
    shape: Any, fan_in: int, fan_out: int, seed: int, counter: int = 0, *, gain: float = 1.0, device: str = "auto"
) -> Any:
    """Glorot uniform: Var = gain^2 2 / (fan_in + fan_out) (MK-44)."""
    return init_uniform(shape, float(xavier_bound(fan_in, fan_out, gain)), seed, counter, device=device)


@entry_point("rng")
def kaiming_uniform(
    shape: Any, fan_in: int, seed: int, counter: int = 0, *, gain: float = float(np.sqrt(2.0)), device: str = "auto"
) -> Any:
    """He uniform: Var = gain^2 / fan_in (MK-45)."""
    return init_uniform(shape, float(kaiming_bound(fan_in, gain)), seed, counter, device=device)
