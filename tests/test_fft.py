"""FFT / FNO family: the contract is evidenced on the host, and each planted bug is caught by its named item."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import falsification.fft_tests  # noqa: F401 - registers the fft tests
from falsification.registry import FalsifyContext, get_test
from native import fft as nf

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "fft-fno-v1.yaml"


def _run(test: str, **params: object) -> str:
    ctx = FalsifyContext(device="host", profile="quick", seed=0, item={"id": "T", "test": test, "params": params})
    return get_test(test).run(ctx).status.value


def test_contract_evidenced_on_host() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "obligations.cli", "check", str(CONTRACT), "--device", "host"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "violated" not in done.stdout and "error " not in done.stdout
    assert "FFT-CUFFT" in done.stdout and "assumed, not checked" in done.stdout  # never proved


@pytest.mark.parametrize(
    ("test", "variant"),
    [
        ("fft.layout", "double_norm"),  # 1/n applied twice
        ("fft.irfft_dft", "double_norm"),
        ("fft.nyquist", "drop_nyquist"),  # Nyquist bin dropped
        ("fft.irfft_dft", "drop_nyquist"),
        ("fft.omitted_modes", "modes_plus_one"),  # modes off by one
        ("fft.multiply_bitwise", "modes_plus_one"),
        ("fft.multiply_bitwise", "swap_reim"),  # real and imaginary weight parts swapped
        ("fft.conv_dft", "swap_reim"),
    ],
)
def test_planted_bug_is_caught(test: str, variant: str) -> None:
    assert _run(test, variant=variant) == "violated"


def test_guard_refuses_modes_beyond_the_half_spectrum() -> None:
    X = np.zeros((1, 5, 2), np.complex64)
    w = np.zeros((6, 2, 3), np.float32)
    with pytest.raises(ValueError, match="proved plan"):
        nf.spectral_multiply(X, w, w, 6, 8)


def test_fno_example_learns_on_host() -> None:
    import examples.fno_burgers as fno

    assert fno.main(["--steps", "4", "--samples", "8", "--lr", "1e-2"]) == 0
