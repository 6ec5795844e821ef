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
