"""The references' bits on fixed samples, pinned as SHA-256 digests of the code before its speed-ups (8e83d7c).

The softfloat core and spec.norm were made cheaper per call (cached scalars and format constants, one-chunk calls
without a copy loop, cheap emptiness tests); these digests hold every operation, environment, rounding mode and
flag of a special-heavy sample, and the norm references (masked, forward and backward), to the old bits.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from spec import norm
from spec import softfloat as sf

SOFTFLOAT_DIGEST = "5ce713af8784443e3b80e629c3218c2f0b7d3af1618631d4bc71eb6eb3fa3d90"
NORM_DIGEST = "5b9b912e106644df3793524a682261a03ffb5a57246029f348c8a917802aea2e"

_SPECIALS = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345, 1, 0x807FFFFF, 0x00800000]
_SPECIALS += [0x7F7FFFFF, 0x3F800000, 0x33800000, 0x4B800001]


def _put(h: Any, arrays: tuple | list) -> None:
    for o in arrays:
        h.update(np.ascontiguousarray(o).tobytes())


def test_softfloat_bits_and_flags_equal_the_pinned_digest():
    r = np.random.default_rng(2026)
    sp = np.array(_SPECIALS, np.uint32)
    a = np.concatenate([sp.repeat(len(sp)), r.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)])
    b = np.concatenate([np.tile(sp, len(sp)), r.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)])
    c = np.roll(b, 7)
    h = hashlib.sha256()
    for env in ("ieee", "cuda", "cuda-ftz", "x86-sse", "x86-sse-ftz"):
        for rnd in sf.ROUNDING_MODES:
            kw = {"env": env, "rounding": rnd}
            _put(h, sf.add(a, b, flags=True, **kw))
            _put(h, sf.sub(a, b, flags=True, **kw))
            _put(h, sf.mul(a, b, flags=True, **kw))
            _put(h, sf.div(a, b, flags=True, **kw))
            _put(h, sf.fma(a, b, c, flags=True, **kw))
            _put(h, sf.sqrt(a, flags=True, **kw))
            _put(h, (sf.add(a[:5], b[:5], **kw),))
            _put(h, (sf.mul(a[0], b[1], **kw),))  # 0-d operands
            for fmt in (sf.BINARY16, sf.BFLOAT16):
                aa, bb = (a & 0xFFFF).astype(np.uint16), (b >> 16).astype(np.uint16)
                _put(h, sf.add(aa, bb, fmt=fmt, flags=True, **kw) + sf.div(aa, bb, fmt=fmt, flags=True, **kw))
    assert h.hexdigest() == SOFTFLOAT_DIGEST


def test_norm_references_equal_the_pinned_digest():
    r = np.random.default_rng(7)
    h = hashlib.sha256()
    for rows, n in ((3, 17), (1, 40), (5, 9)):
        scale = np.exp2(r.integers(-20, 20, (rows, n)))
        x = (r.standard_normal((rows, n)) * scale).astype(np.float32).view(np.uint32)
        dy = r.standard_normal((rows, n)).astype(np.float32).view(np.uint32)
        w = r.standard_normal(n).astype(np.float32).view(np.uint32)
        bb = r.standard_normal(n).astype(np.float32).view(np.uint32)
        mask = r.random((rows, n)) < 0.7
        outs = [
            norm.softmax(x, mask),
            norm.log_softmax(x),
            norm.softmax_backward(x, dy, mask),
            norm.log_softmax_backward(x, dy),
            norm.layernorm(x, w, bb),
            norm.rmsnorm(x, w),
            *norm.layernorm_backward(x, w, dy),
            *norm.rmsnorm_backward(x, w, dy),
        ]
        _put(h, outs)
    assert h.hexdigest() == NORM_DIGEST
