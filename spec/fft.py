"""Reference semantics of the real FFT and FNO spectral convolution: dense float64 DFTs and the error bounds.

Everything here is an explicit matrix product in float64 (no FFT algorithm): X[k] = sum_t x[t] e^{-2 pi i k t / n}
for k < n // 2 + 1; irfft(Z)[t] = (1/n) sum_k c_k Re(Z[k] e^{2 pi i k t / n}) with c_k = 1 for bin 0 and the
even-n Nyquist bin, 2 otherwise. Bounds (Higham 2002, Thm 24.2, normwise): a radix-2 FFT of length n = 2^L with
twiddles accurate to mu satisfies ||X^ - X||_2 <= beta ||X||_2, beta = L eta / (1 - L eta),
eta = mu + gamma_4 (sqrt 2 + mu); mu = 4u is part of the cuFFT assumption.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "U",
    "MU",
    "gamma",
    "fft_beta",
    "rfft_dense",
    "irfft_dense",
    "spectral_conv_dense",
    "rfft_bound",
    "irfft_bound",
    "spectral_conv_bound",
    "parseval_energy",
    "multiply_f32",
]

U = 2.0**-24
MU = 4 * U


def gamma(k: int, u: float = U) -> float:
    """gamma_k = k u / (1 - k u)."""
    return k * u / (1 - k * u)


def fft_beta(n: int) -> float:
    """beta(n) = L eta / (1 - L eta), L = ceil(log2 n) stages (the normwise relative bound of one transform)."""
    stages = max(1, math.ceil(math.log2(max(n, 2))))
    eta = MU + gamma(4) * (math.sqrt(2) + MU)
    return stages * eta / (1 - stages * eta)


def _weights(n: int) -> np.ndarray:
    c = np.full(n // 2 + 1, 2.0)
    c[0] = 1.0
    if n % 2 == 0:
        c[-1] = 1.0
    return c


def rfft_dense(x: np.ndarray) -> np.ndarray:
    """Dense float64 DFT along axis 1 of (batch, n, width): (batch, n // 2 + 1, width) complex128."""
    n = x.shape[1]
    t, k = np.arange(n), np.arange(n // 2 + 1)
    F = np.exp(-2j * np.pi * np.outer(k, t) / n)
    return np.einsum("kt,btc->bkc", F, np.asarray(x, np.float64))


def irfft_dense(Z: np.ndarray, n: int) -> np.ndarray:
    """Dense float64 inverse along axis 1, normalised by 1/n (imaginary parts of bin 0 and Nyquist ignored)."""
    t, k = np.arange(n), np.arange(n // 2 + 1)
    E = np.exp(2j * np.pi * np.outer(t, k) / n) * _weights(n)[None, :]
    return np.einsum("tk,bko->bto", E, np.asarray(Z, np.complex128)).real / n


def spectral_conv_dense(x: np.ndarray, w_re: np.ndarray, w_im: np.ndarray, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, Z) in float64: Z = X w on the first ``modes`` bins and 0 elsewhere, y = irfft(Z)."""
    n = x.shape[1]
    X = rfft_dense(x)
    Z = np.zeros((X.shape[0], X.shape[1], w_re.shape[2]), np.complex128)
    Z[:, :modes] = np.einsum("bkc,kco->bko", X[:, :modes], np.asarray(w_re, np.float64) + 1j * np.asarray(w_im))
    return irfft_dense(Z, n), Z


def _col_norm(a: np.ndarray) -> np.ndarray:
    """2-norm over axis 1 (the grid / bin axis), kept as a broadcastable axis."""
    return np.sqrt((np.abs(a) ** 2).sum(axis=1, keepdims=True))


def rfft_bound(x: np.ndarray) -> np.ndarray:
    """Per-element bound on |X^ - X|: beta sqrt(n) ||x||_2 per column (||X_half|| <= ||X_full|| = sqrt(n)||x||)."""
    n = x.shape[1]
    return fft_beta(n) * math.sqrt(n) * _col_norm(np.asarray(x, np.float64)) * np.ones((1, n // 2 + 1, 1))


def irfft_bound(Z: np.ndarray, n: int) -> np.ndarray:
    """Per-element bound on |y^ - y|: sqrt(2/n) (beta + 2u) ||Z||_2 per column (||y|| <= sqrt(2/n) ||Z_half||)."""
    return math.sqrt(2.0 / n) * (fft_beta(n) + 2 * U) * _col_norm(Z) * np.ones((1, n, 1))


def spectral_conv_bound(x: np.ndarray, w_re: np.ndarray, w_im: np.ndarray, modes: int) -> np.ndarray:
    """Per-element bound on |y^ - y| (normwise per output column), composed from the three stages.

    rFFT: ||dX_c|| <= beta sqrt(n) ||x_c||; multiply: |dZ_ko| <= sum_c |dX_kc| |w_kco| + sqrt2 gamma_{2W+2}
    sum_c |X^_kc| |w_kco|; inverse: ||dy|| <= sqrt(2/n) (||dZ|| + (beta + 2u) ||Z^||).
    """
    n = x.shape[1]
    beta = fft_beta(n)
    win = x.shape[2]
    X = rfft_dense(x)[:, :modes]
    wabs = np.abs(np.asarray(w_re, np.float64) + 1j * np.asarray(w_im, np.float64))  # (modes, win, wout)
    dX = beta * math.sqrt(n) * _col_norm(np.asarray(x, np.float64))[:, 0, :]  # (batch, win)
    prop = np.einsum("bc,co->bo", dX, wabs.max(axis=0))  # ||sum_c dX_c w_c|| <= sum_c ||dX_c|| max_k |w|
    mag = np.einsum("bkc,kco->bko", np.abs(X) * (1 + beta * math.sqrt(n)), wabs)
    mult = math.sqrt(2) * gamma(2 * win + 2) * np.sqrt((mag**2).sum(axis=1))
    dZ = prop + mult
    Z = np.sqrt(
        (np.abs(np.einsum("bkc,kco->bko", X, np.asarray(w_re, np.float64) + 1j * np.asarray(w_im))) ** 2).sum(axis=1)
    )
    dy = math.sqrt(2.0 / n) * (dZ + (beta + 2 * U) * (Z + dZ))
    return dy[:, None, :] * np.ones((1, n, 1))


def parseval_energy(X: np.ndarray, n: int) -> np.ndarray:
    """(1/n) sum_k c_k |X_k|^2 per (batch, column): equals sum_t x_t^2 for X = rfft(x)."""
    X = np.asarray(X, np.complex128)
    return (np.abs(X) ** 2 * _weights(n)[None, :, None]).sum(axis=1) / n


def multiply_f32(X: np.ndarray, w_re: np.ndarray, w_im: np.ndarray, modes: int) -> np.ndarray:
    """The fused multiply in float32 per bin from +0, c in order: re += xr wr, re -= xi wi, im += xr wi, im += xi wr."""
    f = np.float32
    X = np.asarray(X, np.complex64)
    batch, bins, win = X.shape
    wout = w_re.shape[2]
    Z = np.zeros((batch, bins, wout), np.complex64)
    for k in range(min(modes, bins)):
        re = np.zeros((batch, wout), f)
        im = np.zeros((batch, wout), f)
        for c in range(win):
            xr, xi = X[:, k, c].real[:, None], X[:, k, c].imag[:, None]
            wr, wi = np.asarray(w_re[k, c], f)[None], np.asarray(w_im[k, c], f)[None]
            re = np.subtract(np.add(re, np.multiply(xr, wr, dtype=f), dtype=f), np.multiply(xi, wi, dtype=f), dtype=f)
            im = np.add(np.add(im, np.multiply(xr, wi, dtype=f), dtype=f), np.multiply(xi, wr, dtype=f), dtype=f)
        Z[:, k].real, Z[:, k].imag = re, im
    return Z
