"""FFT / FNO spectral convolution (1-D): rFFT/irFFT through cuFFT (``cupy.fft``), fused spectral multiply, VJP.

Layout (shared/reference/kernel-families.md): x (batch, grid, width) row-major; w_re, w_im (modes, win, wout),
index (k * win + c) * wout + o; modes <= grid // 2 + 1. X = rfft(x) along the grid axis (unnormalised,
e^{-2 pi i k t / n}, n // 2 + 1 bins, the Nyquist bin for even n); Z[b, k, o] = sum_c X[b, k, c] (w_re + i w_im)
for k < modes, exactly 0 for the other bins; y = irfft(Z, n), normalised by 1/n.

The fused multiply is one CUDA kernel (one thread per output bin (b, k, o), in the order of
:data:`MULTIPLY_ORDER`); the backward kernels compute dW from X and dZ and dX = dZ conj(w). The host path is
NumPy (pocketfft for the transforms, float32 loops in the kernel's order for the multiply). Planted bugs are
:data:`VARIANTS` entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from obligations.core.symbolic import all_of, as_type, smax

__all__ = [
    "BLOCK",
    "ROUTE",
    "MAX_ELEMENTS",
    "SpectralPlan",
    "spectral_plan",
    "FftVariant",
    "VARIANTS",
    "kernel_source",
    "rfft",
    "irfft",
    "spectral_multiply",
    "spectral_conv",
    "spectral_conv_vjp",
    "MULTIPLY_ORDER",
    "bin_weights",
]

BLOCK = 256
MAX_GRID = 65535
ROUTE = "nvrtc-ieee"
MAX_ELEMENTS = 1 << 40
MULTIPLY_ORDER = ("re += xr*wr", "re -= xi*wi", "im += xr*wi", "im += xi*wr")


@dataclass(frozen=True)
class SpectralPlan:
    """Launch of the fused multiply: one thread per (b, k, o) over ``bins`` = grid // 2 + 1 bins."""

    batch: Any
    grid: Any
    win: Any
    wout: Any
    modes: Any
    bins: Any
    threads: Any
    x_len: Any
    w_len: Any
    z_len: Any
    valid: Any

    def x_index(self, b: Any, k: Any, c: Any) -> Any:
        """Offset of X[b, k, c] (complex elements, int64)."""
        return (as_type(b, "int64") * self.bins + k) * self.win + c

    def w_index(self, k: Any, c: Any, o: Any) -> Any:
        """Offset of w[k, c, o] in w_re / w_im (int64)."""
        return (as_type(k, "int64") * self.win + c) * self.wout + o

    def z_index(self, b: Any, k: Any, o: Any) -> Any:
        """Offset of Z[b, k, o] (complex elements, int64)."""
        return (as_type(b, "int64") * self.bins + k) * self.wout + o

    def thread_of(self, b: Any, k: Any, o: Any) -> Any:
        """The thread that writes Z[b, k, o]."""
        return self.z_index(b, k, o)

    def regimes(self) -> dict[str, Any]:
        """The multiply's paths: an odd or even grid (the even one has a Nyquist bin, weighted once by the inverse),
        with bins past ``modes`` zeroed or every bin kept (modes == bins: the Nyquist bin multiplied)."""
        odd, kept = self.grid % 2 == 1, self.modes == self.bins
        return {
            "odd_grid_tail_zeroed": all_of(odd, self.modes < self.bins),
            "odd_grid_all_kept": all_of(odd, kept),
            "even_grid_nyquist_zeroed": all_of(self.grid % 2 == 0, self.modes < self.bins),
            "even_grid_nyquist_kept": all_of(self.grid % 2 == 0, kept),
        }


def spectral_plan(batch: Any, grid: Any, win: Any, wout: Any, modes: Any) -> SpectralPlan:
    """Sizes of one spectral multiply; valid: positive sizes, 1 <= modes <= bins, every buffer <= 2^40 elements."""
    bins = grid // 2 + 1
    wide = [as_type(v, "int64") for v in (batch, bins, win, wout)]
    per_batch = MAX_ELEMENTS // smax(wide[0], 1)
    per_bin = per_batch // smax(wide[1], 1)
    valid = all_of(
        batch >= 1,
        grid >= 1,
        win >= 1,
        wout >= 1,
        modes >= 1,
        modes <= bins,
        wide[2] <= per_bin,
        wide[3] <= per_bin // smax(wide[2], 1),
    )
    threads = (wide[0] * bins) * wout
    return SpectralPlan(
        batch,
        grid,
        win,
        wout,
        modes,
        bins,
        threads,
        (wide[0] * bins) * win,
        (as_type(modes, "int64") * win) * wout,
        threads,
        valid,
    )


@dataclass(frozen=True)
class FftVariant:
    """A build of the FFT path: which bins are kept and how, the weight parts, the transforms' scaling."""

    name: str
    keep: str = "k < modes"
    wrow: str = "k"
    swap_parts: bool = False
    extra_scale: bool = False  # planted: 1/n applied a second time
    drop_nyquist: bool = False  # planted: the Nyquist bin zeroed before the inverse


VARIANTS: dict[str, FftVariant] = {
    v.name: v
    for v in (
        FftVariant("stated"),
        FftVariant("double_norm", extra_scale=True),
        FftVariant("drop_nyquist", drop_nyquist=True),
        FftVariant("modes_plus_one", keep="k <= modes", wrow="(k < modes ? k : modes - 1)"),
        FftVariant("swap_reim", swap_parts=True),
    )
}

_SOURCE = r"""
#define WROW(k) (@WROW@)
extern "C" __global__ void spectral_multiply(const float2* __restrict__ X, const float* __restrict__ wr,
        const float* __restrict__ wi, float2* __restrict__ Z, long long batch, long long bins, long long win,
        long long wout, long long modes) {
    const long long total = batch * bins * wout;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long o = i % wout, bk = i / wout, k = bk % bins;
        float re = 0.0f, im = 0.0f;
        if (@KEEP@) {
            const long long row = WROW(k);
            for (long long c = 0; c < win; ++c) {
                const float2 x = X[bk * win + c];
                const long long w = (row * win + c) * wout + o;
                const float pr = @WR@[w], pi = @WI@[w];
                re = __fadd_rn(re, __fmul_rn(x.x, pr));
                re = __fsub_rn(re, __fmul_rn(x.y, pi));
                im = __fadd_rn(im, __fmul_rn(x.x, pi));
                im = __fadd_rn(im, __fmul_rn(x.y, pr));
            }
        }
        Z[i] = make_float2(re, im);
    }
}

extern "C" __global__ void spectral_dweights(const float2* __restrict__ X, const float2* __restrict__ dZ,
        float* __restrict__ dwr, float* __restrict__ dwi, long long batch, long long bins, long long win,
        long long wout, long long modes) {
    const long long total = modes * win * wout;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long o = i % wout, kc = i / wout, c = kc % win, k = kc / win;
        float gr = 0.0f, gi = 0.0f;
        for (long long b = 0; b < batch; ++b) {
            const float2 x = X[(b * bins + k) * win + c];
            const float2 g = dZ[(b * bins + k) * wout + o];
            gr = __fadd_rn(gr, __fadd_rn(__fmul_rn(x.x, g.x), __fmul_rn(x.y, g.y)));
            gi = __fadd_rn(gi, __fsub_rn(__fmul_rn(x.x, g.y), __fmul_rn(x.y, g.x)));
        }
        dwr[i] = gr;
        dwi[i] = gi;
    }
}

extern "C" __global__ void spectral_dx(const float2* __restrict__ dZ, const float* __restrict__ wr,
        const float* __restrict__ wi, float2* __restrict__ dX, long long batch, long long bins, long long win,
        long long wout, long long modes) {
    const long long total = batch * bins * win;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long c = i % win, bk = i / win, k = bk % bins;
        float re = 0.0f, im = 0.0f;
        if (k < modes) {
            for (long long o = 0; o < wout; ++o) {
                const float2 g = dZ[bk * wout + o];
                const long long w = (k * win + c) * wout + o;
                re = __fadd_rn(re, __fadd_rn(__fmul_rn(g.x, wr[w]), __fmul_rn(g.y, wi[w])));
                im = __fadd_rn(im, __fsub_rn(__fmul_rn(g.y, wr[w]), __fmul_rn(g.x, wi[w])));
            }
        }
        dX[i] = make_float2(re, im);
    }
}
"""

KERNELS = ("spectral_multiply", "spectral_dweights", "spectral_dx")


def kernel_source(variant: str = "stated") -> str:
    """CUDA source of the spectral kernels for ``variant``."""
    v = VARIANTS[variant]
    wr, wi = ("wi", "wr") if v.swap_parts else ("wr", "wi")
    return _SOURCE.replace("@KEEP@", v.keep).replace("@WROW@", v.wrow).replace("@WR@", wr).replace("@WI@", wi)


@register_builds("fft")
def _builds() -> Iterator[Build]:
    """The shipped spectral kernels (exact float32 arithmetic, 64-bit indices)."""
    src = kernel_source()
    for k in KERNELS:
        yield Build("fft", k, src, k, ROUTE, index_bits=None)  # see native.scan.INDEX_BITS_AUDITED


def _xp(device: str) -> Any:
    from obligations.core.device import array_module

    return array_module(device)


def _grid(threads: int) -> int:
    return max(1, min(-(-threads // BLOCK), MAX_GRID))


def _fn(variant: str, name: str) -> Any:
    from native.nvrtc import compile_function

    return compile_function(kernel_source(variant), name, ROUTE)


# -- transforms (cuFFT through cupy.fft on the device, pocketfft on the host) --------------------------------


def rfft(x: Any, *, device: str = "host", variant: str = "stated") -> Any:
    """Unnormalised real FFT along axis 1 of (batch, n, width) float32: (batch, n // 2 + 1, width) complex64."""
    xp = _xp(device)
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    # cupy.fft transforms along a swapped axis and returns a strided view: the kernels need C order.
    return xp.ascontiguousarray(xp.fft.rfft(x, axis=1), dtype=xp.complex64)


def irfft(Z: Any, n: int, *, device: str = "host", variant: str = "stated") -> Any:
    """Inverse real FFT along axis 1, normalised by 1/n: (batch, n // 2 + 1, width) complex64 -> float32."""
    xp = _xp(device)
    v = VARIANTS[variant]
    Z = xp.ascontiguousarray(Z, dtype=xp.complex64)
    if v.drop_nyquist and n % 2 == 0:
        Z = Z.copy()
        Z[:, n // 2] = 0
    y = xp.ascontiguousarray(xp.fft.irfft(Z, n=n, axis=1), dtype=xp.float32)
    return (y * xp.float32(1.0 / n)).astype(xp.float32) if v.extra_scale else y


def bin_weights(n: int, bins: int, xp: Any = np) -> Any:
    """c_k: 1 for bin 0 and the even-n Nyquist bin, 2 for the others (how often a bin occurs in the spectrum)."""
    c = xp.full(bins, 2.0)
    c[0] = 1.0
    if n % 2 == 0:
        c[n // 2] = 1.0
    return c


# -- the fused multiply and its backward ---------------------------------------------------------------------


def _guard(X: Any, w_re: Any, modes: int, grid: int) -> tuple[int, int, int, int]:
    batch, bins, win = (int(s) for s in X.shape)
    wout = int(w_re.shape[2])
    plan = spectral_plan(batch, grid, win, wout, modes)
    if not plan.valid or int(plan.bins) != bins or tuple(w_re.shape) != (modes, win, wout):
        raise ValueError(
            f"spectral multiply outside its proved plan: X {tuple(X.shape)}, w {tuple(w_re.shape)}, "
            f"modes {modes}, grid {grid}"
        )
    return batch, bins, win, wout


def spectral_multiply(
    X: Any, w_re: Any, w_im: Any, modes: int, grid: int, *, device: str = "host", variant: str = "stated"
) -> Any:
    """Z[b, k, o] = sum_c X[b, k, c] (w_re + i w_im)[k, c, o] for kept bins, 0 elsewhere (complex64)."""
    xp = _xp(device)
    v = VARIANTS[variant]
    X = xp.ascontiguousarray(X, dtype=xp.complex64)
    w_re, w_im = (xp.ascontiguousarray(w, dtype=xp.float32) for w in (w_re, w_im))
    batch, bins, win, wout = _guard(X, w_re, modes, grid)
    if device != "host":
        Z = xp.empty((batch, bins, wout), xp.complex64)
        _fn(variant, "spectral_multiply")(
            (_grid(batch * bins * wout),),
            (BLOCK,),
            (X, w_re, w_im, Z, np.int64(batch), np.int64(bins), np.int64(win), np.int64(wout), np.int64(modes)),
        )
        return Z
    pr, pi = (w_im, w_re) if v.swap_parts else (w_re, w_im)
    k = np.arange(bins)
    keep = k <= modes if v.keep == "k <= modes" else k < modes
    rows = np.minimum(k[keep], modes - 1)
    xr, xi = X.real[:, keep], X.imag[:, keep]
    f = np.float32
    re = np.zeros((batch, int(keep.sum()), wout), f)
    im = np.zeros_like(re)
    for c in range(win):
        a, b = xr[:, :, c, None], xi[:, :, c, None]
        wr, wi = pr[rows, c][None], pi[rows, c][None]
        re = (re + a * wr).astype(f)
        re = (re - b * wi).astype(f)
        im = (im + a * wi).astype(f)
        im = (im + b * wr).astype(f)
    Z = np.zeros((batch, bins, wout), np.complex64)
    Z.real[:, keep], Z.imag[:, keep] = re, im
    return Z


def spectral_conv(x: Any, w_re: Any, w_im: Any, modes: int, *, device: str = "host", variant: str = "stated") -> Any:
    """y = irfft(spectral_multiply(rfft(x))) for x (batch, grid, win): (batch, grid, wout) float32."""
    n = int(x.shape[1])
    X = rfft(x, device=device, variant=variant)
    return irfft(
        spectral_multiply(X, w_re, w_im, modes, n, device=device, variant=variant), n, device=device, variant=variant
    )


def spectral_conv_vjp(
    x: Any, w_re: Any, w_im: Any, modes: int, dy: Any, *, device: str = "host", variant: str = "stated"
) -> tuple[Any, Any, Any]:
    """(dx, dw_re, dw_im) of <dy, spectral_conv(x)>: dZ = rfft(dy) c_k / n; dW from X, dZ; dx = n irfft(dX / c_k)."""
    xp = _xp(device)
    n = int(x.shape[1])
    X = rfft(x, device=device)
    G = rfft(dy, device=device)
    batch, bins, win = (int(s) for s in X.shape)
    wout = int(G.shape[2])
    ck = bin_weights(n, bins, xp)
    dZ = xp.ascontiguousarray(G * (ck / n).astype(xp.float32)[None, :, None], dtype=xp.complex64)
    w_re, w_im = (xp.ascontiguousarray(w, dtype=xp.float32) for w in (w_re, w_im))
    _guard(X, w_re, modes, n)
    if device != "host":
        dwr, dwi = xp.empty((modes, win, wout), xp.float32), xp.empty((modes, win, wout), xp.float32)
        dX = xp.empty((batch, bins, win), xp.complex64)
        args = (np.int64(batch), np.int64(bins), np.int64(win), np.int64(wout), np.int64(modes))
        _fn(variant, "spectral_dweights")((_grid(modes * win * wout),), (BLOCK,), (X, dZ, dwr, dwi, *args))
        _fn(variant, "spectral_dx")((_grid(batch * bins * win),), (BLOCK,), (dZ, w_re, w_im, dX, *args))
    else:
        Xm, dZm = X[:, :modes], dZ[:, :modes]
        dwr = np.einsum("bkc,bko->kco", Xm.real, dZm.real) + np.einsum("bkc,bko->kco", Xm.imag, dZm.imag)
        dwi = np.einsum("bkc,bko->kco", Xm.real, dZm.imag) - np.einsum("bkc,bko->kco", Xm.imag, dZm.real)
        dX = np.zeros((batch, bins, win), np.complex64)
        dX[:, :modes] = np.einsum("bko,kco->bkc", dZm, (w_re - 1j * w_im).astype(np.complex64))
        dwr, dwi = dwr.astype(np.float32), dwi.astype(np.float32)
    dx = irfft((dX / ck.astype(xp.float32)[None, :, None]).astype(xp.complex64), n, device=device) * xp.float32(n)
    return dx.astype(xp.float32), dwr, dwi
