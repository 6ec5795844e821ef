"""The bottom layer: machine-typed symbolic integers, plan calling, outcomes, devices.

It imports nothing of kernel-contracts above it; ``spec``, ``native``, ``falsification`` and the rest of
``obligations`` build on it (``tests/test_layers.py`` checks the order from the import graph).
"""
