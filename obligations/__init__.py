"""kernel-contracts: checkable contracts for GPU kernels."""

__version__ = "0.1.0"
