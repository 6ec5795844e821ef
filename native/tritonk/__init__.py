"""Triton kernels (``@triton.jit``), imported only where a launch or an audit needs them: each module imports triton.

``native.builds.load_native_modules`` imports this package (this file) and not its modules, so listing builds or
entry points never imports triton. Host wrappers, plans and builds live in ``native/triton_*.py``.
"""
