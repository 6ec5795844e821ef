"""The binary32 softfloat operations as one fused CUDA kernel each, for CuPy arrays.

The array code of :mod:`spec.softfloat.arith` runs on CuPy too, but as ~50 array operations per call (one
kernel launch and one pass over memory each) plus host syncs for the special operands. This module holds the
same algorithms written once in C++ over 32-bit and 64-bit integers (the array code's ``Work`` widths,
normalisation with count-leading-zeros, the same round/pack core), compiled as CuPy elementwise kernels:
one launch per call, no temporaries. The array code stays the definition: the test suite compiles this very
source with the host C++ compiler and checks it bit for bit against the NumPy run of the array code on edge
classes and dense samples in every rounding mode and environment, and on CUDA checks the device kernel the
same way (``benchmarks/bench_softfloat.py --device cuda`` checks it too).

Used by :func:`spec.softfloat.add` (and sub, mul, div, fma, sqrt) when the operands are CuPy arrays of
binary32 bits and no flags are requested; :func:`set_enabled` turns it off (the array code then runs).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .env import FloatEnv, default_nan
from .formats import BINARY32, RDN, RNA, RNE, RTO, RTZ, RUP, Format

__all__ = ["SOURCE", "ROUNDING_CODES", "OPS", "env_args", "applies", "set_enabled", "run", "sqrt_table"]

ROUNDING_CODES: dict[str, int] = {RNE: 0, RNA: 1, RTZ: 2, RUP: 3, RDN: 4, RTO: 5}
OPS: dict[str, int] = {"add": 2, "sub": 2, "mul": 2, "div": 2, "fma": 3, "sqrt": 1}
_ENABLED = {"on": True}


def set_enabled(on: bool) -> None:
    """Use the fused kernels for CuPy operands (True, the default) or the array code (False)."""
    _ENABLED["on"] = bool(on)


def sqrt_table() -> list[int]:
    """The sqrt seed table of the array code for binary32 (m = p + 2 = 26): ceil(sqrt((T + 1) 2^(2m-8)))."""
    m = 26
    sh = 2 * m - 8
    tab = [0] * 1024
    for t in range(256, 1024):
        v = (t + 1) << sh
        r = math.isqrt(v)
        tab[t] = r if r * r == v else r + 1
    return tab


def env_args(rounding: str, env: FloatEnv) -> tuple[int, int, int, int, int, int]:
    """(rounding code, ftz, daz, cuda NaN policy, tininess after rounding, default NaN bits) for the kernel."""
    return (
        ROUNDING_CODES[rounding],
        int(env.ftz),
        int(env.daz),
        int(env.nan_policy == "cuda"),
        int(env.tininess == "after"),
        default_nan(BINARY32, env),
    )


_CORE = r"""
typedef unsigned int kc_u32;
typedef unsigned long long kc_u64;
#ifdef KC_SOFTFLOAT_HOST
#define KC_DEV static inline
static inline int kc_clz32(kc_u32 x) { return x ? __builtin_clz(x) : 32; }
static inline int kc_clz64(kc_u64 x) { return x ? __builtin_clzll(x) : 64; }
#define KC_TABLE static const
#else
#define KC_DEV __device__ __forceinline__
KC_DEV int kc_clz32(kc_u32 x) { return __clz(x); }
KC_DEV int kc_clz64(kc_u64 x) { return __clzll(x); }
#define KC_TABLE __device__ const
#endif

struct KcEnv { int rnd, ftz, daz, nan_cuda, tin_after; kc_u32 dn; };
enum { KC_RNE = 0, KC_RNA = 1, KC_RTZ = 2, KC_RUP = 3, KC_RDN = 4, KC_RTO = 5 };
#define KC_ABS 0x7FFFFFFFu
#define KC_SIGN 0x80000000u
#define KC_INF 0x7F800000u
#define KC_QUIET 0x00400000u

KC_DEV int kc_msb(kc_u32 x) { return 31 - kc_clz32(x); }
KC_DEV int kc_msb(kc_u64 x) { return 63 - kc_clz64(x); }
KC_DEV bool kc_isnan(kc_u32 x) { return (x & KC_ABS) > KC_INF; }

// core._round_shift: round sig right by rsh >= 1 bits (last bit of sig sticky).
template <typename U> KC_DEV U kc_round_shift(U sig, U rsh, U sign, int rnd) {
    const U one = 1;
    switch (rnd) {
    case KC_RTZ: return sig >> rsh;
    case KC_RNE: return (sig + (((one << rsh) >> one) - one) + ((sig >> rsh) & one)) >> rsh;
    case KC_RNA: return (sig + ((one << rsh) >> one)) >> rsh;
    case KC_RUP: return (sig + (sign == 0 ? (one << rsh) - one : (U)0)) >> rsh;
    case KC_RDN: return (sig + (sign == 1 ? (one << rsh) - one : (U)0)) >> rsh;
    default: { U q = sig >> rsh; return q | (U)((q << rsh) != sig); }
    }
}

// core.round_pack for binary32 with a BITS-wide work type U (P = BITS - 3), flags not computed.
template <typename U, int BITS> KC_DEV kc_u32 kc_round_pack(U sign, int e, U sig, const KcEnv& env) {
    const int P = BITS - 3, F = 23;
    const int m = kc_msb(sig);
    const U sig_n = sig << (U)(P - m);
    const int E = e + m;
    const int t = E + 126;
    const int ebf = t > 0 ? t : 0;
    int r = (P - F) - t;
    r = r < P - F ? P - F : (r > BITS - 1 ? BITS - 1 : r);
    const U mant = kc_round_shift<U>(sig_n, (U)r, sign, env.rnd);
    U enc = ((U)(ebf < 255 ? ebf : 255) << F) + mant;
    const bool nz = sig != 0;
    if (!nz) enc = 0;
    if (enc >= (U)KC_INF) {
        const int rnd = env.rnd;
        bool to_inf = rnd == KC_RNE || rnd == KC_RNA;
        if (rnd == KC_RUP) to_inf = sign == 0;
        if (rnd == KC_RDN) to_inf = sign == 1;
        enc = to_inf ? (U)KC_INF : (U)(KC_INF - 1u);
    }
    if (env.ftz) {
        bool tiny = nz && E < -126;
        if (env.tin_after) {
            const U full = kc_round_shift<U>(sig_n, (U)(P - F), sign, env.rnd);
            tiny = tiny && !((E == -127) && ((full >> 24) != 0));
        }
        if (tiny) enc = 0;
    }
    return (kc_u32)enc | ((kc_u32)sign << 31);
}

template <typename U> struct KcUnpacked { U sign, sig; int e; bool special; };

// core.unpack for binary32: |x| = sig * 2^e for finite x; subnormals share the exponent of field 1.
template <typename U> KC_DEV KcUnpacked<U> kc_unpack(kc_u32 x, int daz) {
    KcUnpacked<U> r;
    const kc_u32 ef = (x >> 23) & 0xFFu;
    const bool normal = ef != 0;
    U sig = (U)((x & 0x7FFFFFu) | ((kc_u32)normal << 23));
    if (daz && !normal) sig = 0;
    r.sign = (U)(x >> 31);
    r.sig = sig;
    r.e = (int)(ef > 1u ? ef : 1u) - 150;
    r.special = ef == 0xFFu;
    return r;
}

// core.nan_result: the first NaN operand quieted, or the default NaN under the CUDA policy.
KC_DEV kc_u32 kc_nan_result(kc_u32 x, kc_u32 y, kc_u32 z, int n, const KcEnv& env) {
    if (env.nan_cuda) return env.dn;
    kc_u32 r = env.dn;
    if (n > 2 && kc_isnan(z)) r = z | KC_QUIET;
    if (n > 1 && kc_isnan(y)) r = y | KC_QUIET;
    if (kc_isnan(x)) r = x | KC_QUIET;
    return r;
}

KC_DEV kc_u32 kc_daz_abs(kc_u32 x, int daz) {
    const kc_u32 xa = x & KC_ABS;
    return (daz && xa <= 0x7FFFFFu) ? 0u : xa;
}

// arith._add_chunk (work width 32, three guard bits).
KC_DEV kc_u32 kc_sf_add(kc_u32 a, kc_u32 b, int negate_b, const KcEnv& env) {
    typedef kc_u32 U;
    const kc_u32 bb = negate_b ? b ^ KC_SIGN : b;
    const bool swap = (bb & KC_ABS) > (a & KC_ABS);
    const kc_u32 hi = swap ? bb : a, lo = swap ? a : bb;
    const KcUnpacked<U> H = kc_unpack<U>(hi, env.daz), L = kc_unpack<U>(lo, env.daz);
    if (H.special || L.special) {
        const bool inf_x = (a & KC_ABS) == KC_INF, inf_y = (b & KC_ABS) == KC_INF;
        kc_u32 r = inf_x ? a : bb;
        if (inf_x && inf_y && ((a ^ bb) >= KC_SIGN)) r = env.dn;
        if (kc_isnan(a) || kc_isnan(b)) r = kc_nan_result(a, b, 0u, 2, env);
        return r;
    }
    const int dd = H.e - L.e;
    const U d = (U)(dd < 31 ? dd : 31);
    const U A = H.sig << 3, Bf = L.sig << 3;
    U B = Bf >> d;
    B |= (U)((B << d) != Bf);
    const bool same = H.sign == L.sign;
    const U X = same ? A + B : A - B;
    U sign = H.sign;
    if (!same && X == 0) sign = env.rnd == KC_RDN ? 1u : 0u;
    return kc_round_pack<U, 32>(sign, H.e - 3, X, env);
}

// arith._mul_chunk (work width 64).
KC_DEV kc_u32 kc_sf_mul(kc_u32 a, kc_u32 b, const KcEnv& env) {
    typedef kc_u64 U;
    const KcUnpacked<U> A = kc_unpack<U>(a, env.daz), B = kc_unpack<U>(b, env.daz);
    if (A.special || B.special) {
        const kc_u32 xa = kc_daz_abs(a, env.daz), ya = kc_daz_abs(b, env.daz);
        const kc_u32 s = (a ^ b) & KC_SIGN;
        const bool bad = (xa == KC_INF && ya == 0u) || (ya == KC_INF && xa == 0u);
        kc_u32 r = bad ? env.dn : (s | KC_INF);
        if (kc_isnan(a) || kc_isnan(b)) r = kc_nan_result(a, b, 0u, 2, env);
        return r;
    }
    return kc_round_pack<U, 64>(A.sign ^ B.sign, A.e + B.e, A.sig * B.sig, env);
}

// arith._normalize to bit 23 (subnormal operands); zero stays zero.
KC_DEV void kc_normalize(kc_u64& sig, int& e, int top) {
    if (sig == 0) return;
    int s = top - kc_msb(sig);
    if (s > 0) { sig <<= s; e -= s; }
}

// arith._div_chunk (work width 64, p + 2 extra quotient bits, remainder jammed).
KC_DEV kc_u32 kc_sf_div(kc_u32 a, kc_u32 b, const KcEnv& env) {
    typedef kc_u64 U;
    const KcUnpacked<U> A = kc_unpack<U>(a, env.daz), B = kc_unpack<U>(b, env.daz);
    U sa = A.sig, sb = B.sig;
    int ea = A.e, eb = B.e;
    kc_normalize(sa, ea, 23);
    kc_normalize(sb, eb, 23);
    if (A.special || B.special || sb == 0) {
        const kc_u32 xa = kc_daz_abs(a, env.daz), ya = kc_daz_abs(b, env.daz);
        const kc_u32 s = (a ^ b) & KC_SIGN;
        const bool bad = (xa == KC_INF && ya == KC_INF) || (xa == 0u && ya == 0u);
        kc_u32 r = ya == KC_INF ? s : (s | KC_INF);
        if (bad) r = env.dn;
        if (kc_isnan(a) || kc_isnan(b)) r = kc_nan_result(a, b, 0u, 2, env);
        return r;
    }
    const U num = sa << 26;
    U q = num / sb;
    const U rem = num - q * sb;
    q |= (U)(rem != 0);
    return kc_round_pack<U, 64>(A.sign ^ B.sign, ea - eb - 26, q, env);
}

// arith._fma_chunk (work width 64, both summands normalised to bit 60).
KC_DEV kc_u32 kc_sf_fma(kc_u32 a, kc_u32 b, kc_u32 c, const KcEnv& env) {
    typedef kc_u64 U;
    const KcUnpacked<U> A = kc_unpack<U>(a, env.daz), B = kc_unpack<U>(b, env.daz), C = kc_unpack<U>(c, env.daz);
    if (A.special || B.special || C.special) {
        const kc_u32 xa = kc_daz_abs(a, env.daz), ya = kc_daz_abs(b, env.daz), za = c & KC_ABS;
        const kc_u32 s = (a ^ b) & KC_SIGN;
        const bool zero_inf = (xa == KC_INF && ya == 0u) || (ya == KC_INF && xa == 0u);
        const bool p_inf = (xa == KC_INF || ya == KC_INF) && !zero_inf;
        const bool nan = kc_isnan(a) || kc_isnan(b) || kc_isnan(c);
        const bool bad = zero_inf || (p_inf && !nan && za == KC_INF && ((s ^ c) >= KC_SIGN));
        kc_u32 r = p_inf ? (s | KC_INF) : c;
        if (bad) r = env.dn;
        if (nan) r = kc_nan_result(a, b, c, 3, env);
        return r;
    }
    const U prod = A.sig * B.sig;
    const U sp = A.sign ^ B.sign;
    const int mp = kc_msb(prod), mc = kc_msb(C.sig);
    const U P = prod << (U)(60 - mp);
    const U Cn = C.sig << (U)(60 - mc);
    const int lowest = -(1 << 20);
    const int ep = prod == 0 ? lowest : A.e + B.e - (60 - mp);
    const int ec = C.sig == 0 ? lowest : C.e - (60 - mc);
    const int d = ep - ec;
    const U dp = (U)(-d > 0 ? (-d < 62 ? -d : 62) : 0);
    const U dc = (U)(d > 0 ? (d < 62 ? d : 62) : 0);
    U Ps = P >> dp;
    Ps |= (U)((Ps << dp) != P);
    U Cs = Cn >> dc;
    Cs |= (U)((Cs << dc) != Cn);
    const int e = ep > ec ? ep : ec;
    const bool same = sp == C.sign;
    const bool c_big = Cs > Ps;
    const U X = same ? Ps + Cs : (c_big ? Cs - Ps : Ps - Cs);
    U sign = (!same && c_big) ? C.sign : sp;
    if (!same && X == 0) sign = env.rnd == KC_RDN ? 1u : 0u;
    return kc_round_pack<U, 64>(sign, e, X, env);
}

// arith._sqrt_chunk for p = 24 (pp = 24, m = 26, s = 28): table seed, two Newton steps, remainder jammed.
KC_DEV kc_u32 kc_sf_sqrt(kc_u32 a, const KcEnv& env) {
    typedef kc_u64 U;
    const KcUnpacked<U> A = kc_unpack<U>(a, env.daz);
    if (A.special || A.sign != 0 || A.sig == 0) {
        const kc_u32 xa = kc_daz_abs(a, env.daz);
        const bool neg = (a >= KC_SIGN) && xa != 0u;
        kc_u32 r = xa == 0u ? (a & KC_SIGN) : a;
        if (neg) r = env.dn;
        if (kc_isnan(a)) r = kc_nan_result(a, 0u, 0u, 1, env);
        return r;
    }
    U sig = A.sig << 1;
    int e = A.e - 1;
    kc_normalize(sig, e, 24);
    const int odd = e & 1;
    sig <<= odd;
    e -= odd;
    const U S = sig << 28;
    U r = kc_sqrt_tab[(int)(S >> 44)];
    for (int k = 0; k < 2; ++k) r = (r + S / (r > 1 ? r : (U)1)) >> 1;
    r -= (U)(r * r > S);
    r |= (U)(r * r != S);
    return kc_round_pack<U, 64>((U)0, (e - 28) >> 1, r, env);
}
"""


@functools.cache
def _source() -> str:
    tab = ", ".join(f"{v}ull" for v in sqrt_table())
    table = f"KC_TABLE kc_u64 kc_sqrt_tab[1024] = {{{tab}}};\n"
    head, rest = _CORE.split("// arith._add_chunk", 1)
    return head + table + "// arith._add_chunk" + rest


SOURCE = _source()

_EXPR = {
    "add": "kc_sf_add(a, b, 0, env)",
    "sub": "kc_sf_add(a, b, 1, env)",
    "mul": "kc_sf_mul(a, b, env)",
    "div": "kc_sf_div(a, b, env)",
    "fma": "kc_sf_fma(a, b, c, env)",
    "sqrt": "kc_sf_sqrt(a, env)",
}
_ENV_PARAMS = "int32 rnd, int32 ftz, int32 daz, int32 nanc, int32 tin, uint32 dn"


@functools.cache
def _kernel(op: str) -> Any:
    import cupy  # noqa: PLC0415 - only for CuPy operands

    names = "abc"[: OPS[op]]
    params = ", ".join(f"uint32 {n}" for n in names) + ", " + _ENV_PARAMS
    body = f"const KcEnv env = {{rnd, ftz, daz, nanc, tin, dn}}; r = {_EXPR[op]};"
    return cupy.ElementwiseKernel(params, "uint32 r", body, f"kc_softfloat_{op}", preamble=SOURCE)


def applies(arrays: Any, fmt: Format, flags: bool) -> bool:
    """Whether the fused kernel serves this call: CuPy operands of binary32 bits, no flags, enabled."""
    if not _ENABLED["on"] or flags or fmt != BINARY32:
        return False
    return all(type(a).__module__.startswith("cupy") for a in arrays)


def run(op: str, arrays: Any, rounding: str, env: FloatEnv) -> Any:
    """``op`` on CuPy binary32 bit arrays (broadcast like the array code) in one kernel launch."""
    return _kernel(op)(*arrays, *env_args(rounding, env))
