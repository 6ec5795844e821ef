"""The JSON form of a graph, its payload and (optionally) inputs, loaded with node-level errors.

::

    {"format": "kc-graph-ir", "version": 1,
     "nodes": [{"id": 0, "op": "input", "parents": [], "shape": [2]},
               {"id": 1, "op": "const", "parents": [], "shape": [2]},
               {"id": 2, "op": "add", "parents": [0, 1], "shape": [2]}],
     "payload": {"1": {"value": {"shape": [2], "data": [0.25, 0.25]}}},
     "inputs": [{"shape": [2], "data": [0.6, -0.2]}],
     "output": 2}

A tensor is ``{"shape": [...], "data": [floats]}`` (each number rounded to binary32) or ``{"shape": [...],
"bits": [uint32]}`` (exact bit patterns: :func:`to_json` writes ``bits`` wherever a value is not finite).
Attributes are scalars or flat lists of scalars: a nested list (a tensor in an attribute) is rejected,
since parameters live in the payload. The schema is ``spec/ir/graph.schema.json``; :func:`from_json`
validates against it and reports every problem as ``node K: ...`` (or ``payload[K]``, ``inputs[i]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from spec.ir.graph import Graph, Node, Payload

__all__ = [
    "SCHEMA_PATH",
    "LoadResult",
    "schema",
    "to_json",
    "from_json",
    "load",
    "dump",
    "tensor_to_json",
    "tensor_from_json",
]

SCHEMA_PATH = Path(__file__).with_name("graph.schema.json")


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of the graph form (shipped next to this module)."""
    return json.loads(SCHEMA_PATH.read_text())


@dataclass(frozen=True)
class LoadResult:
    """A loaded document: graph, payload, inputs (or None), output id (or None) and the errors found."""

    graph: Graph | None
    payload: Payload
    inputs: tuple[np.ndarray, ...] | None = None
    output: int | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when the document loaded without errors."""
        return not self.errors


def tensor_to_json(a: np.ndarray) -> dict[str, Any]:
    """A float32 array as a JSON tensor: data if every value is finite, else exact bits."""
    a = np.asarray(a, dtype=np.float32)
    if np.isfinite(a).all():
        return {"shape": list(a.shape), "data": [float(v) for v in a.reshape(-1)]}
    return {"shape": list(a.shape), "bits": [int(v) for v in a.reshape(-1).view(np.uint32)]}


def tensor_from_json(t: dict[str, Any]) -> np.ndarray:
    """A JSON tensor as a float32 array; ValueError when the element count does not match the shape."""
    shape = tuple(int(d) for d in t["shape"])
    if "bits" in t:
        flat = np.array(t["bits"], dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        flat = np.array(t["data"], dtype=np.float64).astype(np.float32)
    if flat.size != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"{flat.size} values for shape {list(shape)}")
    return flat.reshape(shape)


def to_json(
    graph: Graph, payload: Payload | None = None, inputs: Any = None, output: int | None = None
) -> dict[str, Any]:
    """The JSON form of a graph with its payload, inputs and output id."""
    doc: dict[str, Any] = {"format": "kc-graph-ir", "version": 1, "nodes": []}
    for n in graph.nodes:
        node: dict[str, Any] = {"id": n.id, "op": n.kind, "parents": list(n.parents), "shape": list(n.out_shape)}
        if len(n.attrs):
            node["attrs"] = {k: list(v) if isinstance(v, tuple) else v for k, v in n.attrs.items()}
        doc["nodes"].append(node)
    if payload is not None and payload.entries:
        doc["payload"] = {
            str(k): {name: tensor_to_json(a) for name, a in v.items()} for k, v in sorted(payload.entries.items())
        }
    if inputs is not None:
        doc["inputs"] = [tensor_to_json(a) for a in inputs]
    if output is not None:
        doc["output"] = int(output)
    return doc


def _where(path: list[Any]) -> str:
    if len(path) >= 2 and path[0] == "nodes" and isinstance(path[1], int):
        rest = ".".join(str(p) for p in path[2:])
        return f"node {path[1]}" + (f" ({rest})" if rest else "")
    if len(path) >= 2 and path[0] == "payload":
        rest = ".".join(str(p) for p in path[2:])
        return f"payload[{path[1]}]" + (f".{rest}" if rest else "")
    if len(path) >= 2 and path[0] == "inputs":
        return f"inputs[{path[1]}]"
    return "document" + (f" ({'.'.join(str(p) for p in path)})" if path else "")


def _schema_errors(doc: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errs = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(list(e.absolute_path))}: {e.message}" for e in errs]


def from_json(doc: Any) -> LoadResult:
    """Load a parsed JSON document; every problem is reported at its node (graph None when nodes are bad)."""
    errors = _schema_errors(doc)
    if errors:
        return LoadResult(None, Payload(), errors=tuple(errors))
    nodes = tuple(
        Node(n["id"], tuple(n["parents"]), n["op"], tuple(n["shape"]), n.get("attrs", {})) for n in doc["nodes"]
    )
    entries: dict[int, dict[str, np.ndarray]] = {}
    for key, tensors in (doc.get("payload") or {}).items():
        for name, t in tensors.items():
            try:
                entries.setdefault(int(key), {})[name] = tensor_from_json(t)
            except (ValueError, OverflowError) as e:  # OverflowError: a shape or bit pattern past int64/uint64
                errors.append(f"payload[{key}].{name}: {e}")
    inputs = None
    if "inputs" in doc:
        arrs = []
        for i, t in enumerate(doc["inputs"]):
            try:
                arrs.append(tensor_from_json(t))
            except (ValueError, OverflowError) as e:
                errors.append(f"inputs[{i}]: {e}")
        inputs = tuple(arrs)
    return LoadResult(Graph(nodes), Payload(entries), inputs, doc.get("output"), tuple(errors))


def load(path: str | Path) -> LoadResult:
    """Read and load a JSON file; a syntax error is reported with its line and column."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        return LoadResult(None, Payload(), errors=(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}",))
    except OSError as e:
        return LoadResult(None, Payload(), errors=(f"{path}: {e.strerror}",))
    return from_json(doc)


def dump(
    path: str | Path, graph: Graph, payload: Payload | None = None, inputs: Any = None, output: int | None = None
) -> None:
    """Write the JSON form to ``path``."""
    Path(path).write_text(json.dumps(to_json(graph, payload, inputs, output), indent=1) + "\n")
