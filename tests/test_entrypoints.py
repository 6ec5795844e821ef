"""Entry-point coverage: calls are recorded at run time; an offered variant no item called is unchecked."""

from __future__ import annotations

import numpy as np

from obligations.core.entrypoints import Call, entry_point, entry_points, recording, unchecked, variants


@entry_point("probe", axes={"order": ("fold", "tree")}, devices=("host",))
def probe_sum(x, order="fold", device="host"):
    """Sum in the named order (a stand-in for a family's entry point)."""
    return float(np.sum(x))


@entry_point("probe", devices=("host",))
def probe_divide(a, b, device="host"):
    """Planted: a divide replaced by a reciprocal multiply, on an entry point no item calls."""
    return a * (1.0 / b)


def test_calls_are_recorded_with_their_axis_values_and_device():
    with recording() as log:
        probe_sum(np.ones(3), order="tree")
        probe_sum(np.ones(3))
    assert log == {
        Call("probe", "probe_sum", "host", (("order", "tree"),)),
        Call("probe", "probe_sum", "host", (("order", "fold"),)),
    }


def test_outside_a_recording_nothing_is_kept():
    with recording() as log:
        pass
    probe_sum(np.ones(2))
    assert log == set()


def test_an_entry_point_no_item_calls_is_unchecked():
    with recording() as log:
        probe_sum(np.ones(3), order="fold")
    missing = unchecked("probe", log, devices=("host",))
    assert Call("probe", "probe_divide", "host", ()) in missing  # the planted reciprocal is seen as unchecked
    assert Call("probe", "probe_sum", "host", (("order", "tree"),)) in missing
    assert len(missing) == 2


def test_variants_are_the_product_of_axes_and_devices():
    (ep,) = [e for e in entry_points("probe") if e.name == "probe_sum"]
    assert {v.axes for v in variants(ep)} == {(("order", "fold"),), (("order", "tree"),)}


def test_nested_recordings_each_see_their_calls():
    with recording() as outer:
        with recording() as inner:
            probe_divide(1.0, 2.0)
    assert inner == outer == {Call("probe", "probe_divide", "host", ())}


class _FakeCupyArray:
    """A value whose type lives in a module named cupy: the device scan reads it as a CUDA array."""


_FakeCupyArray.__module__ = "cupy._core.core"


def _forms(a, b, *rest, order="fold", device="auto", **extra):
    """A signature with every parameter kind: positional, *args, keyword-only with defaults, **kwargs."""


def _positional_only(x, order="fold", /, device="auto", *, mode=None):
    """Axes that are positional-only (a keyword of the same name goes to no parameter)."""


def test_the_fast_observer_records_what_binding_the_signature_records():
    import inspect

    from obligations.core.entrypoints import EntryPoint, _observe_slow, _observer

    gpu = _FakeCupyArray()
    cases = {
        _forms: [
            ((1, 2), {}),
            ((1, 2), {"order": "tree"}),
            ((1, 2, 3, 4), {"device": "cuda"}),
            ((gpu, 2), {}),
            ((1, 2, gpu), {}),  # in *args: bound.arguments holds the tuple, not the array
            ((1,), {"b": gpu}),
            ((1, 2), {"stray": gpu, "order": "tree"}),  # in **extra: not scanned either
            ((1, 2), {"device": "host", "order": None}),
            ((gpu, 2), {"device": "auto"}),
        ],
        _positional_only: [
            ((1,), {}),
            ((1, "tree"), {}),
            ((gpu, "tree", "cuda"), {"mode": 3}),
            ((1,), {"device": "cuda"}),
        ],
    }
    axes = {"order": ("fold", "tree"), "b": (1, 2), "mode": (None, 3), "absent": (0,)}
    for fn, calls in cases.items():
        sig = inspect.signature(fn)
        ep = EntryPoint("probe", fn.__name__, {a: v for a, v in axes.items() if a != "b" or fn is _forms})
        observe = _observer(ep, sig)
        for args, kwargs in calls:
            assert observe(args, kwargs) == _observe_slow(ep, sig, args, kwargs), (fn.__name__, args, kwargs)
            assert observe(args, kwargs) is observe(args, kwargs)  # memoised


def test_a_paused_block_records_nothing_and_recording_resumes_after_it():
    from obligations.core.entrypoints import paused

    with recording() as log:
        with paused():
            probe_sum(np.ones(2), order="tree")
        probe_sum(np.ones(2))
    assert log == {Call("probe", "probe_sum", "host", (("order", "fold"),))}


def test_a_self_recording_entry_point_records_every_call_and_is_not_wrapped():
    from obligations.core.entrypoints import note_call, recording_log

    def probe_scale(x, factor=2.0, device="host"):
        """Scale, reporting its own calls (as native.gemm.matmul does on its cached path)."""
        if recording_log() is not None:
            note_call(probe_scale, (x,), {"factor": factor, "device": device})
        return x * factor

    fn = entry_point("probe_self", axes={"factor": (2.0, 3.0)}, devices=("host",), records_itself=True)(probe_scale)
    assert fn is probe_scale  # no wrapper frame on the hot path
    with recording() as log:
        fn(np.ones(2))
        fn(np.ones(2), factor=3.0)
    assert log == {
        Call("probe_self", "probe_scale", "host", (("factor", "2.0"),)),
        Call("probe_self", "probe_scale", "host", (("factor", "3.0"),)),
    }
    assert unchecked("probe_self", log, devices=("host",)) == []


def test_a_self_recording_entry_point_that_never_notes_its_calls_is_refused():
    import pytest

    def silent(x, device="host"):
        """Planted: claims to record itself, never does."""
        return x

    with pytest.raises(ValueError, match="never calls note_call"):
        entry_point("probe_silent", devices=("host",), records_itself=True)(silent)
    assert not entry_points("probe_silent")


def test_matmul_records_its_cached_calls_too():
    from native import gemm as ng

    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    ng.matmul(a, b, device="host")  # prepared and cached outside the recording
    with recording() as log:
        ng.matmul(a, b, device="host")  # the cached path
        ng.matmul(a, b.T.copy(), trans_b=True, device="host")
    assert {c.axes for c in log if c.name == "matmul"} == {
        (("trans_a", "False"), ("trans_b", "False")),
        (("trans_a", "False"), ("trans_b", "True")),
    }
    assert all(c.device == "host" for c in log if c.name == "matmul")
