"""Captures a model with ``torch.export`` (non-strict) as the fx ``GraphModule`` form the rest of
graphpipe consumes, for models whose Python torch.fx cannot follow (Hugging Face ``transformers``
models: CLIP, GPT-2, LLaVA, BERT).

What the exported program becomes (``ep.module()``, the unlifted graph, then normalised here):

- parameters and buffers are ``get_attr`` nodes under their original fully qualified names (the
  unlifted module holds the model's own tensors, tied ones as one object under each name), so
  stage modules, ``state_dict`` and checkpoints keep the plain model's names;
- every operator keeps its owning module path from torch.export's ``nn_module_stack`` in
  ``node.meta["nn_module_stack"]``, which ``graphpipe.trace`` reads for costs, manual plans and
  printed plans;
- the batch dimension of every input is dynamic (``Dim.AUTO``), so one capture runs at any
  micro-batch size, unless the model's code fixes it (``static_batch``: the program then runs
  at the traced batch size only, so trace with one micro-batch); the size arithmetic on the inputs (``sym_size`` and what is computed from
  it) is marked ``meta["inputs_only"]``: each stage computes what it needs of it, so that no
  stage waits for another one for a shape;
- ``no_grad`` regions (``wrap_with_set_grad_enabled`` sub-graphs) are inlined, their operators
  marked ``meta["grad_enabled"] = False`` as the fx tracer marks them;
- a device the capture wrote into an operator (``.to(x.device)``, ``torch.arange(...,
  device=...)``) becomes the device of an input, so that a stage runs where its inputs are (a
  GPU, or the meta device of shape propagation);
- torch.export's input guards and metadata assertions are dropped (the runtime checks every
  batch against the traced example before it runs, ``runtime/batch_check.py``);
- the flat outputs are put back into the model's own output structure (a ``ModelOutput``, a
  dataclass, a dict) by one last operator, so ``loss_fn`` gets what the plain model returns.

Train and eval: the program is the forward of the mode the model was captured in. A capture in
training mode marks the arguments that ``model.eval()`` changes in ATen terms (``MODE_ARG``):
the ``train``/``training`` flag of dropout, batch norm and rrelu, the ``dropout_p`` of
``scaled_dot_product_attention`` (attention code passes ``0.0 if not self.training``), and the
batch-norm batch counter's increment (``num_batches_tracked.add_(1)``, eval adds 0);
``set_mode`` then switches a GraphModule made of these nodes (a stage module) between them, as
``move_exported_model_to_eval``/``_train`` (torchao's pt2e tools, no longer in torch 2.13's
``torch.ao.quantization``) rewrite dropout and batch-norm patterns.
Other Python branches on ``self.training`` stay as captured: ``eval_mismatch`` runs the plain
model in eval mode against the capture switched to eval on the example, so that such a branch
is reported instead of giving wrong eval outputs. A capture in eval mode has no training values
to switch back to. Autocast regions inside ``forward`` are refused.
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from graphpipe.capture import Capture, FrontEnd, ModeSwitch, copy_tensors, input_leaves, redirect_inplace_uses
from graphpipe.errors import InputError, TraceError

__all__ = ["MODE_ARG", "ExportFrontEnd", "ExportModes", "ExportedCapture", "eval_mismatch", "export_capture", "set_mode"]


@dataclass
class ExportedCapture:
    module: fx.GraphModule
    #: pytree structure of ``(args, kwargs)`` the program was captured with; placeholders are its
    #: leaves in order
    input_spec: Any
    #: the mode (``model.training``) the program was captured in
    training: bool
    #: names of the operators that depend on the mode (dropout, batch norm), for messages
    mode_ops: list[str] = field(default_factory=list)
    #: the batch size the program is fixed to (the model's code depends on it), None if dynamic
    static_batch: int | None = None


_MODE_OPS = {
    "aten::dropout", "aten::native_dropout", "aten::feature_dropout", "aten::alpha_dropout",
    "aten::feature_alpha_dropout", "aten::batch_norm", "aten::native_batch_norm",
    "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional", "aten::rrelu_with_noise",
}


#: node.meta key of an operator argument that depends on the mode: ``(key, train value, eval
#: value)``, key an index into node.args or a keyword name
MODE_ARG = "graphpipe_mode_arg"


def _mark_mode_args(graph: fx.Graph) -> None:
    """Marks, in a program captured in training mode, each operator argument that holds the
    training value of something ``model.eval()`` would change (module docstring)."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        arguments = node.target._schema.arguments
        for i, arg in enumerate(arguments):
            if i < len(node.args):
                key, value = i, node.args[i]
            elif arg.name in node.kwargs:
                key, value = arg.name, node.kwargs[arg.name]
            else:
                key, value = arg.name, arg.default_value
            if arg.name in ("train", "training") and str(arg.type) == "bool" and value is True:
                # only the flags that are on: an operator the model runs in eval mode on purpose
                # (training=False in a training forward) stays so in both modes
                node.meta[MODE_ARG] = (key, True, False)
            elif node.target is sdpa and arg.name == "dropout_p" and isinstance(value, float) and value > 0:
                node.meta[MODE_ARG] = (key, value, 0.0)
        if node.target is torch.ops.aten.add_.Tensor and len(node.args) == 2 and node.args[1] == 1:
            counter = node.args[0]
            if isinstance(counter, fx.Node) and counter.op == "get_attr" and \
                    str(counter.target).split(".")[-1] == "num_batches_tracked":
                node.meta[MODE_ARG] = (1, 1, 0)  # batch norm counts batches in training only


def check_mode(captured_training: bool | None, eval_problem: str | None, model_name: str, training: bool) -> None:
    """Raises InputError where a capture cannot run in the mode asked for: captured by
    torch.export in eval mode (no training values for its dropout, batch norm and branches on
    self.training), or captured in training with ``eval_problem`` (its branches on
    self.training). ``captured_training`` is None for an fx capture (any mode runs)."""
    if captured_training is False and training:
        raise InputError(
            f"{model_name} was captured by torch.export in eval mode, which has no training values for "
            "its dropout, batch norm and branches on self.training; call model.train() before graphpipe.wrap"
        )
    if captured_training and not training and eval_problem is not None:
        raise InputError(f"{eval_problem}; call model.eval() before graphpipe.wrap to run it in eval mode")


def set_mode(module: nn.Module, training: bool) -> None:
    """Switches the marked operators of an export capture's GraphModule (or of a stage module
    made of its nodes) to their training or eval values; a module without marks is unchanged.
    ``module.train(mode)`` remains the caller's to set."""
    if not isinstance(module, fx.GraphModule):
        return
    changed = False
    for node in module.graph.nodes:
        mark = node.meta.get(MODE_ARG)
        if mark is None:
            continue
        key, train_value, eval_value = mark
        value = train_value if training else eval_value
        if isinstance(key, int):
            if node.args[key] != value:
                node.args = (*node.args[:key], value, *node.args[key + 1:])
                changed = True
        elif key not in node.kwargs or node.kwargs[key] != value:
            node.kwargs = {**node.kwargs, key: value}
            changed = True
    if changed:
        module.recompile()


def eval_mismatch(model: nn.Module, module: fx.GraphModule, values: list[Any], args: tuple, kwargs: dict
                  ) -> str | None:
    """For a capture in training mode: runs the plain model in eval mode and the capture switched
    to eval (``set_mode``) on the example inputs (copies, as the caller gives them: ``values``
    are the capture's placeholders). Returns what differs (a Python branch on ``self.training``
    that the capture fixed), None when the outputs agree; None too for a model on the meta
    device, whose outputs cannot be compared. Both modes are put back."""
    tensors = list(model.parameters()) + list(model.buffers())
    if any(t.is_meta for t in tensors):
        return None
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        set_mode(module, False)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            want = pytree.tree_leaves(model(*args, **kwargs))
            got = pytree.tree_leaves(module(*values))
    except Exception as exc:
        return f"running {type(model).__name__} in eval mode on the example failed: {type(exc).__name__}: {exc}"
    finally:
        for m, mode in modes.items():
            m.training = mode
        set_mode(module, True)
    name = type(model).__name__
    if len(got) != len(want):
        return f"{name} returns {len(want)} values in eval mode and {len(got)} in training mode"
    for i, (a, b) in enumerate(zip(got, want)):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            same = a.shape == b.shape and a.dtype == b.dtype and (
                torch.allclose(a, b, equal_nan=True) if a.is_floating_point() or a.is_complex() else torch.equal(a, b))
        else:
            same = type(a) is type(b) and a == b
        if not same:
            return (f"output {i} of {name} in eval mode differs from its training capture with dropout and batch norm "
                    "switched to eval: the model's Python code branches on self.training beyond them")
    return None


class ExportModes(ModeSwitch):
    """A torch.export capture's mode switch: ``check_mode`` and ``set_mode`` on the mode it was
    captured in (``training``), ``eval_problem`` (eval_mismatch's finding) and the operators that
    depend on the mode (``mode_ops``, for messages)."""

    def __init__(self, training: bool, eval_problem: str | None, mode_ops: list[str]) -> None:
        self.training = training
        self.eval_problem = eval_problem
        self.mode_ops = mode_ops

    def check(self, model_name: str, training: bool) -> None:
        check_mode(self.training, self.eval_problem, model_name, training)

    def switch(self, module: nn.Module, training: bool) -> None:
        if self.training:  # a capture in eval mode has no training values to switch to
            set_mode(module, training)


class ExportFrontEnd(FrontEnd):
    """``export_capture`` behind the capture interface (graphpipe/capture.py): its in-place
    writes redirected, the placeholders' values as the leaves of the example, and for a capture
    in training mode the check that eval mode computes what the plain model does."""

    name = "export"
    title = "torch.export"

    def capture(self, model: nn.Module, args: tuple, kwargs: dict[str, Any], *,
                leaf_modules: Any = (), specialized: Any = None) -> Capture:
        exported = export_capture(model, args, kwargs)
        gm = exported.module
        redirect_inplace_uses(gm)
        gm.recompile()
        name = type(model).__name__
        values = (pytree.tree_leaves((args, kwargs)) if exported.input_spec is None
                  else input_leaves(exported.input_spec, args, kwargs, name))
        eval_problem = None
        if exported.training:
            eval_problem = eval_mismatch(model, gm, [copy_tensors(v) for v in values], copy_tensors(tuple(args)),
                                         copy_tensors(dict(kwargs)))
        return Capture(module=gm, values=values, modes=ExportModes(exported.training, eval_problem, exported.mode_ops),
                       input_spec=exported.input_spec, static_batch=exported.static_batch, outputs_checked=True)


def _dynamic_batch(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """dynamic_shapes for ``model(*args, **kwargs)``, by forward() argument (torch.export's
    form): dim 0 of every batched tensor is dynamic."""
    auto = torch.export.Dim.AUTO

    def spec(value: Any) -> Any:
        return {0: auto} if isinstance(value, torch.Tensor) and value.dim() > 0 else None

    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}


def export_capture(model: nn.Module, args: tuple, kwargs: dict) -> ExportedCapture:
    """``torch.export.export(model, args, kwargs, strict=False)`` with a dynamic batch, as the
    normalised fx GraphModule described in the module docstring."""
    try:
        with torch.enable_grad():
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=_dynamic_batch(model, args, kwargs), strict=False)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise TraceError(f"torch.export cannot capture {type(model).__name__}: {text[0] if text else type(exc).__name__}"
                         ) from exc
    gm = ep.module()
    graph = gm.graph
    static_batch = _static_batch(gm, args, kwargs)
    _inline_grad_regions(gm)
    _drop_guards(gm)
    _mark_size_arithmetic(graph)
    _devices_from_inputs(graph)
    out_spec = gm._out_spec
    in_spec = gm._in_spec
    graph._codegen = fx.graph.CodeGen()  # flat placeholders in, the model's own output out
    output = next(n for n in graph.nodes if n.op == "output")
    leaves = list(output.args[0])
    if not out_spec.is_leaf():
        with graph.inserting_before(output):
            rebuilt = graph.call_function(_rebuilder(out_spec), tuple(leaves))
        rebuilt.meta["grad_enabled"] = True
        output.args = (rebuilt,)
    else:
        output.args = (leaves[0],)
    for node in graph.nodes:
        node.meta.setdefault("grad_enabled", True)
    graph.eliminate_dead_code()
    if model.training:
        _mark_mode_args(graph)
    graph.lint()
    # A plain GraphModule over the unlifted one (which refuses train()/eval()): it holds the same
    # parameters and buffers under the same names.
    module = fx.GraphModule(gm, graph, type(model).__name__)
    module.train(model.training)
    mode_ops = [n.name for n in graph.nodes if n.op == "call_function" and _schema_name(n.target) in _MODE_OPS]
    return ExportedCapture(module=module, input_spec=in_spec, training=model.training, mode_ops=mode_ops,
                           static_batch=static_batch)


def _schema_name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    return str(schema.name) if schema is not None else ""


def _rebuilder(spec: Any) -> Any:
    """The operator that rebuilds the model's output structure from its tensors."""

    def rebuild_output(*leaves: Any) -> Any:
        return pytree.tree_unflatten(list(leaves), spec)

    rebuild_output.__qualname__ = "rebuild_output"  # the operator's name in plans and charts
    return rebuild_output


def _static_batch(gm: fx.GraphModule, args: tuple, kwargs: dict) -> int | None:
    """The batch size torch.export fixed, None if the batch stayed dynamic. It is fixed when the
    model's code depends on it (LLaVA, say, loops over the images of a batch in Python); the
    program then runs at that batch size only."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    leaves, _ = pytree.tree_flatten((args, kwargs))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, leaves):
        val = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.dim() > 0 and isinstance(val, torch.Tensor):
            if is_concrete_int(val.shape[0]):
                return int(val.shape[0])
    return None


def _inline_grad_regions(gm: fx.GraphModule) -> None:
    """Replaces every ``wrap_with_set_grad_enabled(mode, submodule, *args)`` by the sub-graph's
    operators, marked with their grad mode (nested regions included)."""
    hop_grad = torch.ops.higher_order.wrap_with_set_grad_enabled
    hop_autocast = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
    graph = gm.graph
    while True:
        node = next((n for n in graph.nodes if n.op == "call_function" and n.target in (hop_grad, hop_autocast)
                     and n.target is not None), None)
        if node is None:
            break
        if node.target is not hop_grad:
            raise TraceError("an autocast region inside forward() cannot be captured for pipelining; "
                             "run the whole model under autocast instead")
        enabled, sub_node, *inputs = node.args
        sub = getattr(gm, str(sub_node.target))
        env: dict[fx.Node, Any] = {}
        results: Any = None
        placeholders = iter(inputs)
        with graph.inserting_before(node):
            for inner in sub.graph.nodes:
                if inner.op == "placeholder":
                    env[inner] = next(placeholders)
                elif inner.op == "output":
                    results = fx.map_arg(inner.args[0], lambda a: env[a])  # noqa: B023 (runs within this iteration)
                elif inner.op == "get_attr":
                    name = f"{sub_node.target}_{inner.target}".replace(".", "_")
                    setattr(gm, name, getattr(sub, str(inner.target)))
                    env[inner] = graph.get_attr(name)
                else:
                    copied = graph.node_copy(inner, lambda a: env[a])  # noqa: B023 (runs within this iteration)
                    copied.meta = dict(inner.meta)
                    # set_grad_enabled sets the mode outright: a nested region, inlined in a later
                    # round, gets its own
                    copied.meta["grad_enabled"] = bool(enabled)
                    env[inner] = copied
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise TraceError(f"unexpected use {user.format_node()} of a no_grad region in the exported program")
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not sub_node.users:
            graph.erase_node(sub_node)
            delattr(gm, str(sub_node.target))


def _drop_guards(gm: fx.GraphModule) -> None:
    """Removes torch.export's input guard module and the operators that only assert (they return
    nothing and write nothing)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target) == "_guards_fn":
            graph.erase_node(node)
            delattr(gm, "_guards_fn")
        elif node.op == "call_function" and not node.users:
            schema = getattr(node.target, "_schema", None)
            if schema is not None and not schema.returns and not schema.is_mutable:
                graph.erase_node(node)


def _is_size_value(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return node.op == "call_function" and isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat,
                                                           torch.SymBool))


def _mark_size_arithmetic(graph: fx.Graph) -> None:
    """Marks size arithmetic computed from the inputs alone (``sym_size`` of an input, integer
    arithmetic on it) ``meta["inputs_only"]``: it is no operator of the OpGraph, and every stage
    that needs a value of it computes it (``runtime/stages.py``). Every rank has the inputs, so
    no stage depends on another for a shape (which would put the two towers of a two-tower
    model in sequence)."""
    sizes: set[fx.Node] = set()
    for node in graph.nodes:
        if _is_size_value(node) and all(a.op == "placeholder" or a in sizes for a in node.all_input_nodes):
            sizes.add(node)
            node.meta["inputs_only"] = True


def input_device(value: torch.Tensor) -> torch.device:
    """The device of a model input: where a stage runs."""
    return value.device


def _devices_from_inputs(graph: fx.Graph) -> None:
    """Replaces the devices torch.export wrote into operators by the device of the first tensor
    input, computed where needed (``inputs_only``)."""
    first = next((n for n in graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)),
                 None)
    if first is None:
        return
    captured = first.meta["val"].device
    device: fx.Node | None = None

    def node() -> fx.Node:
        nonlocal device
        if device is None:
            with graph.inserting_after(first):
                device = graph.call_function(input_device, (first,))
            device.meta.update(inputs_only=True, grad_enabled=True)
        return device

    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if isinstance(n.kwargs.get("device"), torch.device) and n.kwargs["device"] == captured:
            n.update_kwarg("device", node())
        if n.target is torch.ops.aten.to.device and isinstance(n.args[1], torch.device) and n.args[1] == captured:
            n.update_arg(1, node())
