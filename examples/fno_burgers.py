"""A 1-D FNO (the seed's Burgers shape: grid 32, 4 Fourier layers, width 16) trained for a few steps.

Synthetic data generated here (no downloads): random smooth initial conditions u0 and the viscous
Burgers-like target u(T) of the linearised equation u_t = nu u_xx - c u_x, solved exactly in Fourier space.
Every kernel call is a contracted one: spectral convolutions and their backward are native.fft
(contracts/fft-fno-v1.yaml), lifting, pointwise and projection products are native.gemm.matmul (guarded
cuBLAS GEMM, contracts/gemm-cublas-v1.yaml); the rest is elementwise array arithmetic of the host/CuPy module.
Backpropagation is written out by hand (no autograd). Prints the loss per step; exits 1 if it does not fall.

    python examples/fno_burgers.py --device cuda --steps 20
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from native import fft as nf
from native.gemm import matmul
from obligations.core.device import array_module, to_host

__all__ = ["make_data", "FNO", "main"]


def make_data(n_samples: int, grid: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(u0, uT) of shape (n_samples, grid, 1): smooth random u0, uT = exact solution of u_t = nu u_xx - c u_x."""
    rng = np.random.default_rng(seed)
    k = np.fft.rfftfreq(grid, 1.0 / grid)
    spec = (rng.standard_normal((n_samples, k.size)) + 1j * rng.standard_normal((n_samples, k.size))) / (1 + k**2)
    u0 = np.fft.irfft(spec, n=grid, axis=1) * grid
    nu, c, T = 0.05, 1.0, 0.5
    uT = np.fft.irfft(spec * np.exp((-nu * k**2 - 1j * c * k) * T), n=grid, axis=1) * grid
    return u0[..., None].astype(np.float32), uT[..., None].astype(np.float32)


class FNO:
    """lift (1 -> width) -> [spectral conv + pointwise W + bias, relu] x layers -> project (width -> 1)."""

    def __init__(
        self, xp: Any, device: str, grid: int = 32, width: int = 16, modes: int = 12, layers: int = 4, seed: int = 0
    ) -> None:
        rng = np.random.default_rng(seed)
        f = np.float32
        self.xp, self.device, self.grid, self.width, self.modes, self.layers = xp, device, grid, width, modes, layers
        scale = 1.0 / width
        self.params: dict[str, Any] = {
            "P": rng.standard_normal((1, width)),
            "p": np.zeros(width),
            "Q": rng.standard_normal((width, 1)) * scale,
            "q": np.zeros(1),
        }
        for i in range(layers):
            self.params[f"wr{i}"] = rng.uniform(0, scale, (modes, width, width))
            self.params[f"wi{i}"] = rng.uniform(0, scale, (modes, width, width))
            self.params[f"W{i}"] = rng.standard_normal((width, width)) * scale
            self.params[f"b{i}"] = np.zeros(width)
        self.params = {k: xp.asarray(v.astype(f)) for k, v in self.params.items()}

    def _mm(self, a: Any, b: Any, **kw: Any) -> Any:
        return matmul(self.xp.ascontiguousarray(a), self.xp.ascontiguousarray(b), device=self.device, **kw)

    def loss_and_grads(self, u0: Any, uT: Any) -> tuple[float, dict[str, Any]]:
        """Mean squared error and its gradient for every parameter (forward, then backward by hand)."""
        xp, p = self.xp, self.params
        bsz, g, w = u0.shape[0], self.grid, self.width
        h = (self._mm(u0.reshape(-1, 1), p["P"]) + p["p"]).reshape(bsz, g, w)
        tape = []
        for i in range(self.layers):
            s = nf.spectral_conv(h, p[f"wr{i}"], p[f"wi{i}"], self.modes, device=self.device)
            z = s + self._mm(h.reshape(-1, w), p[f"W{i}"]).reshape(bsz, g, w) + p[f"b{i}"]
            a = xp.maximum(z, 0) if i < self.layers - 1 else z
            tape.append((h, z))
            h = a
        out = (self._mm(h.reshape(-1, w), p["Q"]) + p["q"]).reshape(bsz, g, 1)
        diff = out - uT
        loss = float((diff * diff).mean())
        grads: dict[str, Any] = {}
        d = (2.0 / diff.size) * diff.reshape(-1, 1)
        grads["Q"] = self._mm(h.reshape(-1, w), d, trans_a=True)
        grads["q"] = d.sum(axis=0)
        dh = self._mm(d, p["Q"], trans_b=True).reshape(bsz, g, w)
        for i in range(self.layers - 1, -1, -1):
            h_in, z = tape[i]
            dz = dh * (z > 0) if i < self.layers - 1 else dh
            dz = xp.ascontiguousarray(dz, dtype=xp.float32)
            dx, dwr, dwi = nf.spectral_conv_vjp(h_in, p[f"wr{i}"], p[f"wi{i}"], self.modes, dz, device=self.device)
            grads[f"wr{i}"], grads[f"wi{i}"] = dwr, dwi
            grads[f"W{i}"] = self._mm(h_in.reshape(-1, w), dz.reshape(-1, w), trans_a=True)
            grads[f"b{i}"] = dz.reshape(-1, w).sum(axis=0)
            dh = dx + self._mm(dz.reshape(-1, w), p[f"W{i}"], trans_b=True).reshape(bsz, g, w)
        grads["P"] = self._mm(u0.reshape(-1, 1), dh.reshape(-1, w), trans_a=True)
        grads["p"] = dh.reshape(-1, w).sum(axis=0)
        return loss, grads


def main(argv: list[str] | None = None) -> int:
    """Train for ``--steps`` Adam steps; print loss per step and the time; 0 if the loss fell."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="host", choices=["host", "cuda"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=64)
    args = ap.parse_args(argv)
    xp = array_module(args.device)
    u0, uT = (xp.asarray(a) for a in make_data(args.samples, 32))
    model = FNO(xp, args.device)
    m = {k: xp.zeros_like(v) for k, v in model.params.items()}
    v = {k: xp.zeros_like(v) for k, v in model.params.items()}
    losses = []
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss, grads = model.loss_and_grads(u0, uT)
        losses.append(loss)
        for k, gk in grads.items():  # Adam
            gk = gk.reshape(model.params[k].shape)
            m[k] = 0.9 * m[k] + 0.1 * gk
            v[k] = 0.999 * v[k] + 0.001 * gk * gk
            mh, vh = m[k] / (1 - 0.9**step), v[k] / (1 - 0.999**step)
            model.params[k] = (model.params[k] - args.lr * mh / (xp.sqrt(vh) + 1e-8)).astype(xp.float32)
        print(f"step {step:3d}  loss {loss:.6f}")
    to_host(model.params["P"])  # synchronise before timing
    print(
        f"device {args.device}: {args.steps} steps in {time.perf_counter() - t0:.3f} s; "
        f"loss {losses[0]:.6f} -> {losses[-1]:.6f}"
    )
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
