"""Graph IR: an op-tagged SSA graph, its checks, its binary32 denotation, JSON form and rewrites.

API summary (stable; names are added, never renamed):

* :mod:`spec.ir.ops` -- ``OPS`` registry of :class:`OpKind` (name, arity, category, attrs, payload kind,
  shape rule, meaning); ``get_op(name)``, ``op_names()``; plan-style shape arithmetic ``conv_plan``,
  ``pool_plan``, ``slice_plan``, ``concat_plan``, ``broadcast_plan``, ``reshape_plan``, ``attention_plan``,
  ``numel``.
  Op tags are strings: "input", "const", "reshape", "flatten", "concat", "permute", "transpose", "slice",
  "broadcastTo", "expand", "add", "sub", "mul_elem", "div", "maxElem", "minElem", "sqrt", "inv", "neg",
  "abs", "relu", "pow", "rsqrt", "exp", "log", "sin", "cos", "tanh", "sigmoid", "silu", "gelu",
  "reduceSum", "reduceMean", "sum", "linear", "matmul", "bmm", "conv2d", "pool", "softmax", "layernorm",
  "rmsnorm", "attention", "embedding", "rope", "randUniform", "bernoulliMask", "erf", "where".
* :mod:`spec.ir.graph` -- frozen ``Node(id, parents, kind, out_shape, attrs)``, ``Graph(nodes)``,
  ``Payload({node_id: {tensor name: array}})`` (kinds in ``PAYLOAD_KINDS``: const {value}, linear
  {weight (out, in), bias (out,)}, conv2d {weight (Cout, Cin, kh, kw), bias (Cout,)}, norm {weight, bias},
  rmsnorm {weight}, embedding {table (V, D)}), ``GraphBuilder`` (``add(kind, parents, shape, params=...,
  **attrs) -> id``; ``build() -> (Graph, Payload)``), ``format_graph`` (text form).
* :mod:`spec.ir.checks` -- ``check_well_formed(g)``, ``check_inferred_shapes(g)`` (alias ``check_shapes``),
  ``check_payload(g, p)``, ``infer_shapes(g)``: each returns a list of :class:`IRError` values (empty = ok).
* :mod:`spec.ir.denote` -- ``denote_all(g, payload, inputs)`` and ``denote(g, payload, inputs, out_id)``
  on the host in binary32 (returns ``Ok(values)`` / ``Ok(value)`` or an ``IRError``; never raises).
* :mod:`spec.ir.jsonform` -- ``to_json``/``from_json``/``load``/``dump`` and the shipped JSON Schema.
* :mod:`spec.ir.rewrites` -- ``eliminate_dead_nodes``, ``fold_reshapes``, ``fold_constants``.
* :mod:`spec.ir.vjp` -- reverse mode: ``vjp(graph, payload, outputs=, wrt=) -> Backward | IRError`` (the backward
  graph: forward nodes at their ids, the outputs' cotangents as further inputs, ``grads`` the wrt inputs'
  cotangents; ``params=True``: ``param_grads`` of the payload tensors), ``VJP_RULES`` (one rule per op,
  ``register_vjp``), ``PARAM_RULES`` (one per payload-reading op) and ``REFUSED`` (op -> why it has none).
* :mod:`spec.ir.real` -- ``real_all(graph, payload, inputs)``: every node's float64 meaning and a first-order
  running bound on its binary32 denotation's error (what reverse mode is checked against).
"""

from spec.ir.checks import IRError, check_inferred_shapes, check_payload, check_shapes, check_well_formed, checklist
from spec.ir.denote import Ok, denote, denote_all
from spec.ir.graph import PAYLOAD_KINDS, Attrs, Graph, GraphBuilder, Node, Payload, format_graph, format_shape
from spec.ir.ops import OPS, AttrSpec, OpKind, ShapeRuleError, get_op, op_names, register_op

__all__ = [
    "Attrs",
    "AttrSpec",
    "Graph",
    "IRError",
    "Ok",
    "check_inferred_shapes",
    "check_payload",
    "check_shapes",
    "check_well_formed",
    "checklist",
    "denote",
    "denote_all",
    "GraphBuilder",
    "Node",
    "OpKind",
    "OPS",
    "PAYLOAD_KINDS",
    "Payload",
    "ShapeRuleError",
    "format_graph",
    "format_shape",
    "get_op",
    "op_names",
    "register_op",
]
