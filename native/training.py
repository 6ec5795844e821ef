"""A training step run by the fusion backend: the step graph of :mod:`spec.training` compiled once, run per step.

``Trainer(step, task, device)`` compiles the step graph (``native.fusion.compile_subgraph``: GEMMs through the
guarded cuBLAS call, generated elementwise chains, the folds of ``native.reductions``, the pre-written RMSNorm,
RoPE and masked-softmax kernels) and binds one :class:`~native.fusion.CUDAExecutor`. The parameters, the optimizer
state, the batch and the targets stay on the device as arrays the executor reads as inputs; each :meth:`step`
runs the program once (forward, loss, backward, update) and keeps the new parameters and state (copies: the
program's outputs live in its arena, which the next run reuses). On ``host`` the same program runs its host paths
(NumPy).

Nothing in a step depends on anything but its inputs: cuBLAS gives the same bits for the same call on the same
GPU, the folds have a stated order and the update is correctly rounded op by op, so two runs are bitwise equal
(``contracts/training-v1.yaml`` checks it, and that a reduction of unstated order breaks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from native import fusion as nf
from obligations.core.device import array_module, resolve_device, to_host
from spec import training as st

__all__ = ["Trainer", "train", "gemm_shapes"]


class Trainer:
    """One task's training on ``device`` by the fusion backend (the step graph compiled once)."""

    def __init__(
        self,
        step: st.StepGraph,
        task: st.Task,
        device: str = "auto",
        *,
        compile: Callable[..., nf.CUDAProgram] = nf.compile_subgraph,
        hook: Callable[[nf.CUDAExecutor], None] | None = None,
    ) -> None:
        self.sg = step
        self.device = resolve_device(device)
        self.xp = array_module(self.device)
        self.program = compile(step.graph, step.outputs, payload=step.payload)
        self.executor = nf.CUDAExecutor(self.program, step.payload, self.device)
        if hook is not None:  # planted changes to the dispatch table (tests only)
            hook(self.executor)
        params = st.trainable(step, task.params)
        self.x, self.target = self._put(task.x), self._put(task.target)
        self.params = [self._put(p) for p in params]
        self.state = [tuple(self._put(s) for s in ss) for ss in st.initial_state(step, params)]
        self.t = 0
        self.last: dict[int, Any] = {}

    def _put(self, a: Any) -> Any:
        if self.device == "host":
            return np.array(a, np.float32, order="C", copy=True)  # keeps a 0-d array 0-d (ascontiguousarray would not)
        a = np.asarray(a, np.float32, order="C")  # no host copy: the upload copies
        # through a 1-D copy: CuPy may fill a 0-d array from a zero by memset (native.fusion._upload)
        return self.xp.asarray(a.reshape(-1)).reshape(a.shape)

    def inputs(self) -> dict[int, Any]:
        """The step graph's inputs for the next step (device arrays by node id)."""
        sc = st.step_scalars(self.sg, self.t)
        ins = st.step_inputs(self.sg, self.x, self.target, self.params, self.state, self.t)
        ins.update({i: self._put(np.asarray(sc[name], np.float32)) for name, i in self.sg.scalars})
        return ins

    def step(self) -> Any:
        """Run one step; the new parameters and state are kept; returns the loss (a device scalar)."""
        out = self.executor.run(self.inputs())
        self.params = [self.xp.array(out[i], copy=True) for i in self.sg.new_params]
        self.state = [tuple(self.xp.array(out[i], copy=True) for i in ids) for ids in self.sg.new_state]
        self.last = out
        self.t += 1
        return out[self.sg.loss]

    def values(self) -> st.StepValues:
        """The last step's outputs (loss, gradients, new parameters and state) as host arrays."""
        return st.values_of(self.sg, {k: np.asarray(to_host(v), np.float32) for k, v in self.last.items()})

    def host_params(self) -> list[np.ndarray]:
        """The current trainable parameters as host arrays."""
        return [np.asarray(to_host(p), np.float32) for p in self.params]


def train(
    step: st.StepGraph, task: st.Task, steps: int, device: str = "auto", **trainer: Any
) -> tuple[list[np.ndarray], Trainer]:
    """``steps`` steps from the task's initial parameters: every step's loss (host float32 scalars), the trainer."""
    tr = Trainer(step, task, device, **trainer)
    losses = [tr.step() for _ in range(steps)]
    return [np.asarray(to_host(v), np.float32) for v in losses], tr


def gemm_shapes(program: nf.CUDAProgram) -> list[tuple[int, int, int, int]]:
    """(batch, m, k, n) of every matmul step of the program, in step order (the cuBLAS calls one run makes)."""
    g = program.graph
    out = []
    for s in program.steps:
        n = g[s.nodes[0]]
        if s.kind == "cublas" and n.kind in ("matmul", "bmm"):
            a, b = g[n.parents[0]].out_shape, g[n.parents[1]].out_shape
            batch = int(np.prod(a[:-2], dtype=np.int64)) if len(a) > 2 else 1
            out.append((batch, a[-2], a[-1], b[-1]))
    return out
