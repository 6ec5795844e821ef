"""Falsification tests of the FFT / FNO family (contracts/fft-fno-v1.yaml), on the engine.

Registered names; every one takes ``params.variant`` (a :data:`native.fft.VARIANTS` entry; planted bugs are
used by the project's tests only) and ``max_log2`` (largest grid 2^max_log2):

* ``fft.layout`` — bitwise layout facts: n // 2 + 1 bins, rfft(ones)[0] == n, irfft(n e_0) == 1 (n = 2^k).
* ``fft.rfft_dft`` / ``fft.irfft_dft`` — transforms within the normwise FFT bound of a dense float64 DFT.
* ``fft.nyquist`` — even n: rfft's last bin is sum (-1)^t x_t and irfft honours a Nyquist-only spectrum.
* ``fft.parseval`` — (1/n) sum c_k |X_k|^2 within (2 beta + beta^2) sum x^2 of sum x^2.
* ``fft.omitted_modes`` — bins k >= modes of the fused multiply are exactly +0 (bitwise).
* ``fft.multiply_bitwise`` — the fused multiply bitwise :func:`spec.fft.multiply_f32` (the stated order).
* ``fft.conv_dft`` — the spectral convolution within :func:`spec.fft.spectral_conv_bound` of the dense DFT.
* ``fft.adjoint`` {tolerance} — <J v, dy> = <v, J^T dy> for input and weights, relative to the norms.
* ``fft.vjp_fd`` {tolerance} — <grad, v> against central differences of the dense float64 convolution.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check
from falsification.registry import FalsifyContext, register_test
from native import fft as nf
from obligations.core.device import to_host
from obligations.core.plans import regime_of
from obligations.core.results import Outcome
from spec import fft as sf

__all__ = ["draw_case"]


def case_dims(seed: int, log2n: int, batch: int, win: int, wout: int, modes_pick: int, *exact: int) -> tuple[int, int]:
    """(n, modes) of a case: n = 2^log2n and modes in 1..bins from ``modes_pick``; a regime or boundary witness's
    case carries its own (grid, modes) as two more elements (any grid; modes may be past the bins)."""
    if exact:
        return int(exact[0]), int(exact[1])
    n = 1 << log2n
    return n, 1 + modes_pick % (n // 2 + 1)


def draw_case(*case: int) -> dict[str, Any]:
    """x (batch, n, win), weights (modes, win, wout), dy, directions for a case (seed, log2n, batch, win, wout,
    modes_pick[, grid, modes]); see :func:`case_dims`."""
    seed, _, batch, win, wout = case[:5]
    rng = np.random.default_rng(seed)
    n, modes = case_dims(*case)
    bins = n // 2 + 1
    f = np.float32
    return {
        "n": n,
        "modes": modes,
        "x": rng.standard_normal((batch, n, win)).astype(f),
        "w_re": (rng.standard_normal((modes, win, wout)) / win).astype(f),
        "w_im": (rng.standard_normal((modes, win, wout)) / win).astype(f),
        "dy": rng.standard_normal((batch, n, wout)).astype(f),
        "v": rng.standard_normal((batch, n, win)).astype(f),
        "v_re": rng.standard_normal((modes, win, wout)).astype(f),
        "v_im": rng.standard_normal((modes, win, wout)).astype(f),
        "Z": (rng.standard_normal((batch, bins, wout)) + 1j * rng.standard_normal((batch, bins, wout))).astype(
            np.complex64
        ),
    }


def _cases(max_log2: int) -> st.SearchStrategy:
    return st.tuples(
        st.integers(0, 2**32 - 1),
        st.integers(1, max_log2),
        st.integers(1, 3),
        st.integers(1, 4),
        st.integers(1, 4),
        st.integers(0, 1 << 16),
    )


_NAMES = ("seed", "log2n", "batch", "win", "wout", "modes_pick")


def _common(ctx: FalsifyContext, max_default: int = 8) -> dict[str, Any]:
    m = int(ctx.params.get("max_log2", max_default)) + (2 if ctx.budget.scale > 1 else 0)
    return {
        "cases": _cases(m),
        "explicit": ((0, 5, 2, 3, 4, 8), (1, 1, 1, 1, 1, 0), (2, m, 1, 2, 2, 1 << 16)),
        "encode": lambda c: c,
        "decode": lambda rp: tuple(rp.values[:6]),
        "describe": lambda c: dict(zip(_NAMES, c, strict=True)),
    }


def _on(ctx: FalsifyContext, a: Any) -> Any:
    if ctx.device == "host":
        return a
    import cupy

    return cupy.asarray(a)


def _ri(z: Any) -> np.ndarray:
    z = np.asarray(to_host(z))
    return np.concatenate([z.real.reshape(-1), z.imag.reshape(-1)]).astype(np.float64)


def _variant(ctx: FalsifyContext) -> str:
    return str(ctx.params.get("variant", "stated"))


def _bound_check(ctx: FalsifyContext, name: str, native: Any, reference: Any, bound_name: str) -> Outcome:
    check = Check(
        name=f"{name}[{_variant(ctx)}]@{ctx.device}",
        inputs=lambda c: draw_case(*c),
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "error_bound", bound_name=bound_name),
        build={
            "variant": _variant(ctx),
            "transforms": "cupy.fft (cuFFT)" if ctx.device == "cuda" else "numpy.fft (pocketfft)",
            "u": "2^-24",
            "mu": "4u (assumed twiddle accuracy)",
        },
        **_common(ctx),
    )
    return engine.run(ctx, check)


@register_test("fft.layout")
def layout(ctx: FalsifyContext) -> Outcome:
    """Bitwise: bins == n // 2 + 1, rfft(ones)[0] == n + 0i, irfft(n e_0) == 1 everywhere (n a power of two)."""
    v = _variant(ctx)

    def native(c: dict) -> np.ndarray:
        n, width = c["n"], c["x"].shape[2]
        X = to_host(nf.rfft(_on(ctx, np.ones((1, n, width), np.float32)), device=ctx.device, variant=v))
        Z = np.zeros((1, n // 2 + 1, width), np.complex64)
        Z[0, 0] = n
        y = to_host(nf.irfft(_on(ctx, Z), n, device=ctx.device, variant=v))
        head = np.array([X.shape[1]], np.float32)
        return np.concatenate([head, X[0, 0].real, X[0, 0].imag, y.reshape(-1)]).astype(np.float32).view(np.uint32)

    def reference(c: dict) -> Expected:
        n, width = c["n"], c["x"].shape[2]
        exp = np.concatenate([[n // 2 + 1], np.full(width, n), np.zeros(width), np.ones(n * width)])
        return Expected(bits=exp.astype(np.float32).view(np.uint32))

    check = Check(
        name=f"layout[{v}]@{ctx.device}",
        inputs=lambda c: draw_case(*c),
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        build={"variant": v, "facts": "bins, DC of rfft(ones), irfft(n e_0)"},
        **_common(ctx, 12),
    )
    return engine.run(ctx, check)


@register_test("fft.rfft_dft")
def rfft_dft(ctx: FalsifyContext) -> Outcome:
    """rfft within beta(n) sqrt(n) ||x||_2 (per column) of the dense float64 DFT."""
    v = _variant(ctx)
    return _bound_check(
        ctx,
        "rfft",
        lambda c: _ri(nf.rfft(_on(ctx, c["x"]), device=ctx.device, variant=v)),
        lambda c: Expected(
            value=_ri(sf.rfft_dense(c["x"])), bound=np.concatenate([sf.rfft_bound(c["x"]).reshape(-1)] * 2)
        ),
        "beta(n) sqrt(n) ||x_col||_2, beta = L eta / (1 - L eta), eta = mu + gamma_4 (sqrt2 + mu)",
    )


def _hermitian(Z: np.ndarray, n: int) -> np.ndarray:
    Z = Z.copy()
    Z[:, 0] = Z[:, 0].real
    if n % 2 == 0:
        Z[:, -1] = Z[:, -1].real
    return Z


@register_test("fft.irfft_dft")
def irfft_dft(ctx: FalsifyContext) -> Outcome:
    """irfft (1/n included) within sqrt(2/n) (beta + 2u) ||Z||_2 (per column) of the dense float64 inverse."""
    v = _variant(ctx)

    def native(c: dict) -> np.ndarray:
        Z = _hermitian(c["Z"], c["n"])
        return to_host(nf.irfft(_on(ctx, Z), c["n"], device=ctx.device, variant=v)).astype(np.float64).reshape(-1)

    def reference(c: dict) -> Expected:
        Z = _hermitian(c["Z"], c["n"])
        return Expected(value=sf.irfft_dense(Z, c["n"]).reshape(-1), bound=sf.irfft_bound(Z, c["n"]).reshape(-1))

    return _bound_check(ctx, "irfft", native, reference, "sqrt(2/n) (beta(n) + 2u) ||Z_col||_2")


@register_test("fft.nyquist")
def nyquist(ctx: FalsifyContext) -> Outcome:
    """Even n: X[n/2] = sum (-1)^t x_t (rfft) and irfft of a Nyquist-only spectrum is (-1)^t Z/n, within bound."""
    v = _variant(ctx)

    def native(c: dict) -> np.ndarray:
        n = c["n"]
        X = to_host(nf.rfft(_on(ctx, c["x"]), device=ctx.device, variant=v))[:, -1]
        Z = np.zeros_like(c["Z"])
        Z[:, -1] = c["Z"][:, -1].real
        y = to_host(nf.irfft(_on(ctx, Z), n, device=ctx.device, variant=v))
        return np.concatenate([X.real.reshape(-1), X.imag.reshape(-1), y.reshape(-1)]).astype(np.float64)

    def reference(c: dict) -> Expected:
        n, x = c["n"], c["x"].astype(np.float64)
        sign = (-1.0) ** np.arange(n)
        X = np.einsum("t,btc->bc", sign, x)
        zr = c["Z"][:, -1].real.astype(np.float64)
        y = sign[None, :, None] * zr[:, None, :] / n
        bx = sf.rfft_bound(x)[:, -1]
        by = (sf.fft_beta(n) + 2 * sf.U) * np.abs(zr)[:, None, :] / n * np.sqrt(2.0) * np.ones((1, n, 1))
        return Expected(
            value=np.concatenate([X.reshape(-1), np.zeros(X.size), y.reshape(-1)]),
            bound=np.concatenate([bx.reshape(-1), bx.reshape(-1), by.reshape(-1)]),
        )

    return _bound_check(ctx, "nyquist", native, reference, "rfft: beta sqrt(n)||x||; irfft: sqrt2 (beta + 2u)|Z|/n")


@register_test("fft.parseval")
def parseval(ctx: FalsifyContext) -> Outcome:
    """(1/n) sum_k c_k |X^_k|^2 within (2 beta + beta^2) sum x^2 + 2^-40 of sum x^2 (per column)."""
    v = _variant(ctx)

    def native(c: dict) -> np.ndarray:
        X = to_host(nf.rfft(_on(ctx, c["x"]), device=ctx.device, variant=v))
        return sf.parseval_energy(X, c["n"]).reshape(-1)

    def reference(c: dict) -> Expected:
        e = (c["x"].astype(np.float64) ** 2).sum(axis=1).reshape(-1)
        b = sf.fft_beta(c["n"])
        return Expected(value=e, bound=(2 * b + b * b) * e + 2.0**-40)

    return _bound_check(ctx, "parseval", native, reference, "(2 beta + beta^2) ||x||^2 + 2^-40")


def _multiply(ctx: FalsifyContext, c: dict) -> np.ndarray:
    X = sf.rfft_dense(c["x"]).astype(np.complex64)
    Z = nf.spectral_multiply(
        _on(ctx, X),
        _on(ctx, c["w_re"]),
        _on(ctx, c["w_im"]),
        c["modes"],
        c["n"],
        device=ctx.device,
        variant=_variant(ctx),
    )
    return np.asarray(to_host(Z))


@register_test("fft.omitted_modes")
def omitted_modes(ctx: FalsifyContext) -> Outcome:
    """Every bin k >= modes of the fused multiply's output is exactly +0 + 0i."""

    def native(c: dict) -> np.ndarray:
        Z = _multiply(ctx, c)[:, c["modes"] :]
        return (
            np.concatenate([Z.real.reshape(-1), Z.imag.reshape(-1), [np.float32(1)]]).astype(np.float32).view(np.uint32)
        )

    def reference(c: dict) -> Expected:
        bins = c["n"] // 2 + 1
        k = 2 * c["x"].shape[0] * (bins - c["modes"]) * c["w_re"].shape[2]
        return Expected(bits=np.concatenate([np.zeros(k), [1]]).astype(np.float32).view(np.uint32))

    check = Check(
        name=f"omitted[{_variant(ctx)}]@{ctx.device}",
        inputs=lambda c: draw_case(*c),
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        build={"variant": _variant(ctx), "sentinel": "a trailing 1.0 so a case with no omitted bin judges one element"},
        **_common(ctx),
    )
    return engine.run(ctx, check)


@register_test("fft.multiply_bitwise")
def multiply_bitwise(ctx: FalsifyContext) -> Outcome:
    """The fused multiply equals spec.fft.multiply_f32 bit for bit (order: re += xr wr, re -= xi wi, im += ...)."""

    def native(c: dict) -> np.ndarray:
        Z = _multiply(ctx, c)
        return np.concatenate([Z.real.reshape(-1), Z.imag.reshape(-1)]).astype(np.float32).view(np.uint32)

    def reference(c: dict) -> Expected:
        X = sf.rfft_dense(c["x"]).astype(np.complex64)
        Z = sf.multiply_f32(X, c["w_re"], c["w_im"], c["modes"])
        return Expected(
            bits=np.concatenate([Z.real.reshape(-1), Z.imag.reshape(-1)]).astype(np.float32).view(np.uint32)
        )

    check = Check(
        name=f"multiply[{_variant(ctx)}]@{ctx.device}",
        inputs=lambda c: draw_case(*c),
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        build={
            "variant": _variant(ctx),
            "order": list(nf.MULTIPLY_ORDER),
            "route": nf.ROUTE if ctx.device == "cuda" else "host float32, same order",
        },
        from_witness=_from_witness,
        regime_of=_regimes_of,
        refuses=(ValueError,),
        **{**_common(ctx), "decode": lambda rp: tuple(rp.values)},
    )
    return engine.run(ctx, check)


def _from_witness(v: Any) -> tuple:
    """A regime or boundary witness (batch, grid, win, wout, modes) as a case carrying its exact grid and modes."""
    return (0, 0, int(v["batch"]), int(v["win"]), int(v["wout"]), 0, int(v["grid"]), int(v["modes"]))


def _regimes_of(c: tuple) -> list[str]:
    n, modes = case_dims(*c)
    return regime_of(nf.spectral_plan, {"batch": c[2], "grid": n, "win": c[3], "wout": c[4], "modes": modes})


@register_test("fft.conv_dft")
def conv_dft(ctx: FalsifyContext) -> Outcome:
    """The spectral convolution within the composed normwise bound of the dense float64 DFT convolution."""
    v = _variant(ctx)

    def native(c: dict) -> np.ndarray:
        y = nf.spectral_conv(
            _on(ctx, c["x"]), _on(ctx, c["w_re"]), _on(ctx, c["w_im"]), c["modes"], device=ctx.device, variant=v
        )
        return to_host(y).astype(np.float64).reshape(-1)

    def reference(c: dict) -> Expected:
        y, _ = sf.spectral_conv_dense(c["x"], c["w_re"], c["w_im"], c["modes"])
        return Expected(
            value=y.reshape(-1), bound=sf.spectral_conv_bound(c["x"], c["w_re"], c["w_im"], c["modes"]).reshape(-1)
        )

    return _bound_check(ctx, "conv", native, reference, "spec.fft.spectral_conv_bound (rfft, multiply, irfft)")


def _dot(a: Any, b: Any) -> float:
    return float((np.asarray(to_host(a), np.float64) * np.asarray(to_host(b), np.float64)).sum())


def _norm(a: Any) -> float:
    return float(np.linalg.norm(np.asarray(to_host(a), np.float64)))


@register_test("fft.adjoint")
def adjoint(ctx: FalsifyContext) -> Outcome:
    """<J_x v, dy> = <v, dx> and <J_w (v_re, v_im), dy> = <v_re, dw_re> + <v_im, dw_im>, relative to the norms."""
    v = _variant(ctx)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1e-4)

    def native(c: dict) -> np.ndarray:
        on = lambda a: _on(ctx, a)  # noqa: E731
        m = c["modes"]
        dx, dwr, dwi = nf.spectral_conv_vjp(
            on(c["x"]), on(c["w_re"]), on(c["w_im"]), m, on(c["dy"]), device=ctx.device, variant=v
        )
        jv = nf.spectral_conv(on(c["v"]), on(c["w_re"]), on(c["w_im"]), m, device=ctx.device, variant=v)
        jw = nf.spectral_conv(on(c["x"]), on(c["v_re"]), on(c["v_im"]), m, device=ctx.device, variant=v)
        c["_rhs"] = (_dot(c["v"], dx), _dot(c["v_re"], dwr) + _dot(c["v_im"], dwi))
        c["_scale"] = (
            _norm(jv) * _norm(c["dy"]) + _norm(c["v"]) * _norm(dx),
            _norm(jw) * _norm(c["dy"])
            + _norm(np.concatenate([c["v_re"], c["v_im"]])) * _norm(np.concatenate([to_host(dwr), to_host(dwi)])),
        )
        return np.array([_dot(jv, c["dy"]), _dot(jw, c["dy"])])

    def reference(c: dict) -> Expected:
        return Expected(value=np.array(c["_rhs"]), bound=tol * np.array(c["_scale"]) + 1e-30)

    return _bound_check(ctx, "adjoint", native, reference, f"{tol:g} (||Jv|| ||dy|| + ||v|| ||J^T dy||)")


@register_test("fft.vjp_fd")
def vjp_fd(ctx: FalsifyContext) -> Outcome:
    """<(dx, dw_re, dw_im), (v, v_re, v_im)> against central differences of the float64 dense convolution."""
    v = _variant(ctx)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1e-4)
    h = 1e-3

    def native(c: dict) -> np.ndarray:
        dx, dwr, dwi = nf.spectral_conv_vjp(
            _on(ctx, c["x"]),
            _on(ctx, c["w_re"]),
            _on(ctx, c["w_im"]),
            c["modes"],
            _on(ctx, c["dy"]),
            device=ctx.device,
            variant=v,
        )
        return np.array([_dot(c["v"], dx), _dot(c["v_re"], dwr) + _dot(c["v_im"], dwi)])

    def reference(c: dict) -> Expected:
        x, wr, wi, m = (c[k].astype(np.float64) if k != "modes" else c[k] for k in ("x", "w_re", "w_im", "modes"))
        f = lambda xx, r, i: float((sf.spectral_conv_dense(xx, r, i, m)[0] * c["dy"]).sum())  # noqa: E731
        fx = (f(x + h * c["v"], wr, wi) - f(x - h * c["v"], wr, wi)) / (2 * h)
        fw = (f(x, wr + h * c["v_re"], wi + h * c["v_im"]) - f(x, wr - h * c["v_re"], wi - h * c["v_im"])) / (2 * h)
        g = sf.spectral_conv_dense
        sx = _norm(g(c["v"], wr, wi, m)[0]) * _norm(c["dy"]) + 1e-30
        sw = _norm(g(x, c["v_re"], c["v_im"], m)[0]) * _norm(c["dy"]) + 1e-30
        return Expected(value=np.array([fx, fw]), bound=tol * np.array([sx, sw]))

    return _bound_check(
        ctx, "vjp-fd", native, reference, f"{tol:g} ||J v|| ||dy|| (central differences, h = 1e-3, float64 dense DFT)"
    )
