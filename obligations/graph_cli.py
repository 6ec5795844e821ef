"""``kc graph``: check and show graph IR files (the JSON form of spec/ir, see docs/graphs.md).

FILE is a graph's JSON form or an ONNX model (``*.onnx``, imported by ``spec.ir.onnx``; a refused node is a load error
naming it, exit 2; ``--trace`` then needs INPUT).

* ``kc graph check FILE [--output ID]`` -- the compiler checklist, each part reported separately with node
  ids: well-formed, shapes (declared vs inferred), payload, output id. Exit 0 if all pass, 1 if any fails,
  2 if the file does not load (every load error is printed at its node).
* ``kc graph show FILE [--trace [INPUT]] [--bits]`` -- one line per node: op, parents, declared and
  inferred shapes (``!`` marks a mismatch). ``--trace`` evaluates the graph step by step on INPUT (a JSON
  file holding a list of tensors or a graph document with ``inputs``; without INPUT, the file's own
  ``inputs``) and prints each node's value (shape and first elements; ``--bits`` adds the bit patterns),
  stopping at the first error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["configure", "run", "check_file", "show_file"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
_PREVIEW = 8


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``check`` and ``show`` under ``kc graph``."""
    sub = p.add_subparsers(dest="graph_command", required=True)
    c = sub.add_parser("check", help="well-formedness, shapes, payload and output id, errors by node")
    c.add_argument("file", help="a graph in its JSON form, or an ONNX model (*.onnx)")
    from obligations.argtypes import counted

    c.add_argument(
        "--output", type=counted(0), default=None, help="the intended output id (default: the file's, or last)"
    )
    s = sub.add_parser("show", help="declared vs inferred shapes per node; --trace evaluates step by step")
    s.add_argument("file", help="a graph in its JSON form, or an ONNX model (*.onnx)")
    s.add_argument(
        "--trace",
        nargs="?",
        const="-",
        default=None,
        metavar="INPUT",
        help="evaluate on INPUT (JSON tensors; default: the file's inputs) and print every value",
    )
    s.add_argument("--bits", action="store_true", help="with --trace: print binary32 bit patterns too")


def run(args: argparse.Namespace) -> int:
    """Dispatch ``kc graph check|show``."""
    return {"check": check_file, "show": show_file}[args.graph_command](args)


def _load(path: str) -> Any:
    from obligations.jsonsafe import JsonInputError
    from obligations.jsonsafe import load as load_json
    from spec.ir.jsonform import LoadResult, Payload, from_json

    try:
        res = from_json(load_json(path))
    except JsonInputError as e:
        res = LoadResult(None, Payload(), errors=(str(e),))
    except RecursionError:  # nesting inside the limit that the graph reader still walks too deep
        res = LoadResult(None, Payload(), errors=(f"{path}: graph nested too deep to read",))
    if res.graph is None or res.errors:
        for e in res.errors:
            print(e if e.startswith(path) else f"{path}: {e}", file=sys.stderr)
        return None
    return res


def _load_onnx(path: str) -> Any:
    """An ONNX model imported as a LoadResult (output: the model's first output), or None after printing why."""
    from spec.ir.jsonform import LoadResult

    try:
        from spec.ir.onnx import OnnxImportError, import_onnx
    except ImportError as e:  # pragma: no cover - onnx is in the test extra
        print(f"{path}: reading ONNX needs the onnx package ({e})", file=sys.stderr)
        return None
    try:
        imp = import_onnx(path)
    except (OnnxImportError, OSError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return None
    except Exception as e:  # noqa: BLE001 - onnx's own parse errors (DecodeError and the like) at the edge
        print(f"{path}: not a readable ONNX model: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return LoadResult(imp.graph, imp.payload, None, imp.output)


def _load_any(path: str) -> Any:
    """A graph file: ONNX (by its .onnx suffix) or the JSON form."""
    return _load_onnx(path) if path.lower().endswith(".onnx") else _load(path)


def check_file(args: argparse.Namespace) -> int:
    """Print the checklist for one file; the exit code says whether every part passed."""
    from spec.ir.checks import checklist

    res = _load_any(args.file)
    if res is None:
        return EXIT_INVALID
    output = args.output if args.output is not None else res.output
    parts = checklist(res.graph, res.payload, output)
    failed = False
    for name, errs in parts.items():
        if errs is None:
            print(f"{name}: not checked (an earlier check failed)")
        elif not errs:
            print(f"{name}: ok")
        else:
            failed = True
            print(f"{name}: {len(errs)} error(s)")
            for e in errs:
                print(f"  {args.file}: {e}")
    print(f"{len(res.graph.nodes)} nodes: {'FAILED' if failed else 'ok'}")
    return EXIT_FAILED if failed else EXIT_OK


def _preview(v: np.ndarray, bits: bool) -> str:
    import numpy as np

    flat = v.reshape(-1)
    vals = ", ".join(str(np.float32(x)) for x in flat[:_PREVIEW]) + (", ..." if flat.size > _PREVIEW else "")
    out = f"[{vals}]"
    if bits:
        out += "  bits [" + ", ".join(f"0x{int(u):08x}" for u in flat[:_PREVIEW].view(np.uint32)) + "]"
    return out


def _trace_inputs(spec: str, res: Any) -> Any:
    from spec.ir.jsonform import tensor_from_json

    if spec == "-":
        return res.inputs
    from obligations.jsonsafe import load as load_json

    doc = load_json(spec)
    items = doc.get("inputs", []) if isinstance(doc, dict) else doc
    return tuple(tensor_from_json(t) for t in items)


def show_file(args: argparse.Namespace) -> int:
    """Print declared vs inferred shapes per node, and with --trace each node's value in id order."""
    from spec.ir.checks import check_well_formed, infer_node
    from spec.ir.denote import eval_node, floats, normalise_inputs
    from spec.ir.graph import format_shape
    from spec.ir.ops import get_op

    res = _load_any(args.file)
    if res is None:
        return EXIT_INVALID
    g = res.graph
    wf = check_well_formed(g)
    failed = bool(wf)
    for e in wf:
        print(f"{args.file}: {e}")
    width = max((len(n.kind) for n in g.nodes), default=0)
    for n in g.nodes:
        inferred = "?"
        mark = " "
        if not wf and get_op(n.kind) is not None:
            shape, err = infer_node(g, n)
            inferred = format_shape(shape) if shape is not None else f"error: {err.message}"
            if shape != n.out_shape:
                mark, failed = "!", True
        print(
            f"{mark} node {n.id:<3} {n.kind:<{width}}  parents {format_shape(n.parents):<10} "
            f"declared {format_shape(n.out_shape):<12} inferred {inferred}"
        )
    if args.trace is None:
        return EXIT_FAILED if failed else EXIT_OK
    if wf:
        print("trace: not run (the graph is not well formed)")
        return EXIT_FAILED
    try:
        raw = _trace_inputs(args.trace, res)
    except (OSError, ValueError, KeyError) as e:
        print(f"kc: error: cannot read the trace input {args.trace}: {e}", file=sys.stderr)
        return EXIT_INVALID
    if raw is None and args.file.lower().endswith(".onnx"):
        print("trace: an ONNX model carries no input values: give them, --trace INPUT (a JSON list of tensors)")
        return EXIT_FAILED
    ins = normalise_inputs(g, raw if raw is not None else ())
    if not isinstance(ins, dict):
        print(f"trace: {ins}")
        return EXIT_FAILED
    import numpy as np

    print("trace:")
    values: list[np.ndarray] = []
    for n in g.nodes:
        v = eval_node(g, res.payload, values, n, ins)
        if not isinstance(v, np.ndarray):
            print(f"  node {n.id} ({n.kind}): {v}")
            return EXIT_FAILED
        values.append(v)
        print(f"  node {n.id} {n.kind:<{width}} {format_shape(v.shape):<10} {_preview(floats(v), args.bits)}")
    return EXIT_FAILED if failed else EXIT_OK


def _register() -> None:
    from obligations.registry import COMMANDS

    run.help_text = "check or show a graph IR file (JSON form)"  # type: ignore[attr-defined]
    COMMANDS["graph"] = (configure, run)


_register()
