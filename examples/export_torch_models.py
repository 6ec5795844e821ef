"""Export the two PyTorch models the ONNX import is tested on (no downloads; small random weights, fixed seeds).

* ``cnn.onnx``: conv -> batchnorm -> relu -> maxpool, one residual block (conv/bn/relu/conv/bn + skip, relu),
  global average pool, flatten, linear; input (1, 3, 16, 16).
* ``decoder.onnx``: one decoder-only transformer block: learned positions, LayerNorm, causal self-attention
  (2 heads, explicit q k^T / sqrt(d) + causal mask, softmax, @ v), LayerNorm, SiLU MLP, residuals; input (1, 8, 16).

Run where torch is installed (``python3 examples/export_torch_models.py [OUTDIR]``; default: examples/models).
The exporter (TorchScript, opset 17, constant folding; dynamo where TorchScript is gone), the torch version and
each model's torch output on the fixed input (``*.expected.npy``) are written beside the models.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

OPSET = 17
HERE = Path(__file__).resolve().parent


class SmallCNN(nn.Module):
    """conv/bn/relu/maxpool, a residual block, global average pool and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        r = x
        x = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(x)))))
        x = F.relu(x + r)
        return self.fc(torch.flatten(self.gap(x), 1))


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: learned positions, causal multi-head self-attention, SiLU MLP."""

    def __init__(self, t: int = 8, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.pos = nn.Parameter(0.1 * torch.randn(t, d))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.triu(torch.full((t, t), float("-inf")), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        h = x + self.pos
        q, k, v = self.qkv(self.ln1(h)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd) + self.mask
        y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        h = h + self.proj(y)
        return h + self.fc2(F.silu(self.fc1(self.ln2(h))))


def _seeded(model: nn.Module, seed: int) -> nn.Module:
    """Random running statistics for every BatchNorm (so the folded or imported BN is not the identity)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
            m.weight.data.copy_(1 + 0.1 * torch.randn(m.num_features, generator=g))
            m.bias.data.copy_(0.1 * torch.randn(m.num_features, generator=g))
    return model.train(False)  # inference mode: batch norm uses its running statistics


def models() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    """name -> (model in eval mode with seeded weights, input shape)."""
    torch.manual_seed(0)
    cnn = _seeded(SmallCNN(), 1)
    torch.manual_seed(2)
    dec = DecoderBlock().train(False)
    return {"cnn": (cnn, (1, 3, 16, 16)), "decoder": (dec, (1, 8, 16))}


def sample_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """The fixed float32 input the tests feed (NumPy's generator, so no torch is needed to make it)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def export(out: Path) -> dict[str, str]:
    """Export both models into ``out``; returns the provenance written to ``out/provenance.json``."""
    out.mkdir(parents=True, exist_ok=True)
    used = "torchscript"
    for name, (model, shape) in models().items():
        x = torch.from_numpy(sample_input(shape))
        path = out / f"{name}.onnx"
        try:
            torch.onnx.export(
                model,
                (x,),
                str(path),
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
                input_names=["x"],
                output_names=["y"],
            )
        except Exception as e:  # noqa: BLE001 - TorchScript export gone: the dynamo exporter
            print(f"{name}: TorchScript export failed ({type(e).__name__}: {e}); using dynamo=True")
            used = "dynamo"
            torch.onnx.export(
                model,
                (x,),
                str(path),
                opset_version=18,
                dynamo=True,
                input_names=["x"],
                output_names=["y"],
                external_data=False,
            )
        with torch.no_grad():
            np.save(out / f"{name}.expected.npy", model(x).numpy())
    prov = {
        "torch": torch.__version__,
        "exporter": used,
        "opset": str(OPSET),
        "script": "examples/export_torch_models.py",
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    return prov


if __name__ == "__main__":
    print(export(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "models"))
