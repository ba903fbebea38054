"""Turns an ``nn.Module`` into the C++ operator DAG (``OpGraph``) with FLOPs, bytes and parameters.

Two capture front ends, behind one interface (``graphpipe/capture.py``) and listed once in
``FRONT_ENDS``: torch.fx first (``graphpipe/fx_capture.py``), which keeps the model's own
granularity (one node per leaf-module call, the unit a stage is cut from) and needs no real data.
``torch.export`` lowers to ATen operators (several times more nodes, parameters lifted to
inputs), which would make every later layer work harder for no gain where fx works; where fx
cannot follow the model's Python (most Hugging Face ``transformers`` models), ``torch.export``
(non-strict) captures it instead (``graphpipe/export_capture.py``), as an fx GraphModule of ATen
operators that keeps parameter names and each operator's owning module. ``capture="fx"`` or
``"export"`` forces one.

Quantities are recorded per sample: the batch size is the leading dimension of the first tensor
in ``example_inputs``. Shapes, output bytes and FLOPs come from one run of the traced graph on
the example inputs (``torch.utils.flop_counter.FlopCounterMode``, read before and after each
node), so a model on the ``meta`` device is measured without allocating its tensors. That run
happens in the calling thread: traced under ``torch.autocast(dtype=torch.bfloat16)``, the bytes
recorded are those of the bfloat16 activations, and the graph's ``compute_dtype`` says so (the
cost model then prices the devices' bfloat16 rate; ``compute_dtype`` below).
"""

from __future__ import annotations

import contextlib
import inspect
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphpipe import _flops  # noqa: F401  (registers missing FLOP formulas)
from graphpipe._ext import _C
from graphpipe.capture import Capture, FrontEnd, ModeSwitch, copy_tensors, input_leaves, user_frame
from graphpipe.errors import InputError, TraceError
from graphpipe.export_capture import ExportFrontEnd
from graphpipe.fx_capture import FxFrontEnd

__all__ = ["trace", "TracedModel", "trace_module", "batch_size_of", "iter_tensors", "compute_dtype", "autocast_for", "CAPTURES"]

#: The capture front ends, by ``capture=`` name, in the order ``capture="auto"`` tries them: the one
#: list a new front end joins (graphpipe/capture.py).
FRONT_ENDS: dict[str, FrontEnd] = {front_end.name: front_end for front_end in (FxFrontEnd(), ExportFrontEnd())}
#: How ``trace`` captures a model: each front end in turn until one captures it ("auto"), or one alone.
CAPTURES = ("auto", *FRONT_ENDS)


@dataclass
class TracedModel:
    """The fx side of a trace: the GraphModule and how its nodes map onto OpGraph node ids."""

    module: fx.GraphModule
    graph: Any  # _C.OpGraph
    node_ids: dict[str, int] = field(default_factory=dict)  # fx node name -> OpGraph id
    placeholder_values: list[Any] = field(default_factory=list)
    batch_size: int = 1
    #: forward() arguments fixed at trace time (None and Python scalars): name -> value. A call
    #: with another value would run code the trace never saw, so the runtime refuses it.
    specialized: dict[str, Any] = field(default_factory=dict)
    #: the name of the front end that made ``module`` (a key of FRONT_ENDS)
    capture: str = "fx"
    #: the pytree structure of ``(args, kwargs)`` whose leaves are the placeholders (None: one
    #: placeholder per forward parameter)
    input_spec: Any = None
    #: what switching a stage module between training and eval takes (capture.ModeSwitch)
    modes: ModeSwitch = field(default_factory=ModeSwitch)
    #: the only batch size the capture runs at (the model's code depends on it), None if any
    static_batch: int | None = None
    signature: Any = None
    model_name: str = ""

    def _placeholder_names(self) -> list[str]:
        """The graph's placeholders' names, in order. Cached (every step binds its inputs, and
        the walk is over every node of the graph), keyed on the graph and its node count so a
        graph still being edited (export's clean-up) is walked again."""
        graph = self.module.graph
        cached = self.__dict__.get("_placeholders")
        if cached is None or cached[0] is not graph or cached[1] != len(graph.nodes):
            cached = (graph, len(graph.nodes), [n.name for n in graph.nodes if n.op == "placeholder"])
            self.__dict__["_placeholders"] = cached
        return cached[2]

    def input_values(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The value of every placeholder for a call ``model(*args, **kwargs)``, by placeholder
        name. Raises InputError for a call that does not match ``forward`` or passes another
        value for an argument fixed at trace time."""
        kwargs = dict(kwargs or {})
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"inputs do not match {self.model_name}.forward: {exc}") from exc
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for param in self.signature.parameters.values():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(param.name, {}))
        for name, fixed in self.specialized.items():
            given = arguments.get(name)
            if not (given is fixed or (type(given) is type(fixed) and given == fixed)):
                raise InputError(
                    f"{self.model_name}.forward was traced with {name}={fixed!r} and is now given "
                    f"{name}={_describe(given)}; graphpipe fixes arguments that are None or Python "
                    "scalars at trace time: wrap the model with example inputs that pass this "
                    "argument as it is passed in training"
                )
        placeholders = self._placeholder_names()
        if self.input_spec is not None:
            return dict(zip(placeholders, input_leaves(self.input_spec, tuple(args), kwargs, self.model_name)))
        values: list[Any] = []
        for name, param in self.signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                values.append(tuple(bound.arguments.get(name, ())))
            elif param.kind is not inspect.Parameter.VAR_KEYWORD:
                values.append(bound.arguments.get(name))
        return dict(zip(placeholders, values))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)


def iter_tensors(value: Any) -> Iterable[torch.Tensor]:
    """Yields the tensors of a value made of tensors, tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from iter_tensors(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from iter_tensors(item)


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in iter_tensors(value))


def _check_inputs(model: Any, example_inputs: Any, example_kwargs: Any) -> tuple[tuple, dict]:
    if not isinstance(model, nn.Module):
        raise InputError(f"graphpipe.trace needs a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InputError(
            "example_inputs must be a tensor or a tuple/list of tensors, got "
            f"{type(example_inputs).__name__}"
        )
    kwargs = dict(example_kwargs or {})
    for where, value in [*(
        (f"example_inputs[{i}]", v) for i, v in enumerate(example_inputs)
    ), *((f"example_kwargs[{k!r}]", v) for k, v in kwargs.items())]:
        _check_value(where, value)
    return tuple(example_inputs), kwargs


def _check_value(where: str, value: Any) -> None:
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float)):
        return
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _check_value(f"{where}[{i}]", item)
        return
    if isinstance(value, Mapping):
        for k, item in value.items():
            _check_value(f"{where}[{k!r}]", item)
        return
    raise InputError(
        f"{where} is a {type(value).__module__}.{type(value).__name__}; graphpipe needs "
        "torch.Tensor values (or tuples, lists and dicts of them); convert it with torch.as_tensor"
    )


def batch_size_of(example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any]) -> int:
    """The leading dimension of the first tensor among the inputs (the batch dimension)."""
    for t in iter_tensors((tuple(example_inputs), dict(example_kwargs))):
        if t.dim() == 0:
            raise InputError("the first example input is a 0-d tensor; graphpipe needs a batch dimension")
        return int(t.shape[0])
    raise InputError("example_inputs contain no tensor: graphpipe needs at least one batched tensor")


def _specialized_arguments(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """forward() arguments that are None or Python scalars in the example: fx fixes them at
    these values (so `if mask is not None:` or `if flag:` trace as the example takes them)."""
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        raise InputError(f"example inputs do not match {type(model).__name__}.forward: {exc}") from exc
    bound.apply_defaults()
    fixed: dict[str, Any] = {}
    for name, param in inspect.signature(model.forward).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        value = bound.arguments.get(name)
        if value is None or isinstance(value, (bool, int, float, str)):
            fixed[name] = value
    return fixed


def _target_name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "placeholder":
        return str(node.target)
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))).__name__
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # aten.addmm.default
    short = getattr(target, "__name__", None)
    for namespace, prefix in ((torch, "torch"), (torch.nn.functional, "torch.nn.functional")):
        if short and getattr(namespace, short, None) is target:
            return f"{prefix}.{short}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    if module in ("_operator", "operator"):
        module = "operator"
    if module.startswith("torch._C._nn"):
        module = "torch.nn.functional"
    return f"{module}.{name}" if module else name


def _owner(node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = str(next(reversed(stack.values()))[0])
        # torch.export's placeholder for operators it records outside any module
        return "" if path.startswith("_empty_nn_module_stack") else path
    return ""


class _Recorder(fx.Interpreter):
    """Runs the traced graph once, recording each node's output bytes and FLOPs."""

    def __init__(self, gm: fx.GraphModule, counter: FlopCounterMode) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.counter = counter
        self.flops: dict[str, float] = {}
        self.out_bytes: dict[str, int] = {}
        self.outputs: Any = None

    def run_node(self, n: fx.Node) -> Any:
        before = self.counter.get_total_flops()
        value = super().run_node(n)
        self.flops[n.name] = float(self.counter.get_total_flops() - before)
        self.out_bytes[n.name] = _nbytes(value)
        if n.op == "output":
            self.outputs = value
        return value


def _check_outputs(value: Any, where: str = "output") -> None:
    if isinstance(value, torch.Tensor):
        return
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _check_outputs(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, item in value.items():
            _check_outputs(item, f"{where}[{k!r}]")
        return
    raise InputError(
        f"model {where} is a {type(value).__name__}; graphpipe needs outputs that are tensors "
        "or nested tuples/lists/dicts of tensors (return the value as a tensor, or drop it)"
    )


def trace_module(
    model: nn.Module,
    example_inputs: Any,
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    leaf_modules: Iterable[str | type[nn.Module]] = (),
    capture: str = "auto",
) -> TracedModel:
    """Traces ``model`` and builds its OpGraph, keeping the fx GraphModule beside it.

    Most users want :func:`trace`; this variant is for code that needs the fx graph too
    (profiling, splitting into stage modules).
    """
    args, kwargs = _check_inputs(model, example_inputs, example_kwargs)
    if capture != "auto" and capture not in FRONT_ENDS:
        raise InputError(f"capture must be one of {['auto', *FRONT_ENDS]}, got {capture!r}")
    if capture != "auto" and tuple(leaf_modules) and not FRONT_ENDS[capture].takes_leaf_modules:
        takers = [f for f in FRONT_ENDS.values() if f.takes_leaf_modules]
        raise InputError(f"leaf_modules apply to the {' and '.join(f.title for f in takers)} capture only; drop them "
                         f"or use capture={takers[0].name!r}")
    batch = batch_size_of(args, kwargs)
    specialized = _specialized_arguments(model, args, kwargs)
    front_end, captured = _capture(model, args, kwargs, leaf_modules, capture, specialized)
    gm, values = captured.module, captured.values
    recorder = _measure(model, gm, values)
    if not captured.outputs_checked:
        _check_outputs(recorder.outputs)

    graph = _C.OpGraph()
    graph.model_name = type(model).__name__
    graph.trace_batch_size = batch
    graph.compute_dtype = compute_dtype(model, args, kwargs)
    traced = TracedModel(
        module=gm, graph=graph, placeholder_values=values, batch_size=batch, specialized=specialized,
        capture=front_end, input_spec=captured.input_spec, modes=captured.modes,
        static_batch=captured.static_batch, signature=inspect.signature(model.forward),
        model_name=type(model).__name__,
    )
    _add_nodes(model, gm, traced, recorder, batch)
    _add_edges(model, gm, traced, recorder, batch)
    graph.validate()
    return traced


def compute_dtype(model: nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> str:
    """The precision ``model`` computes in when run here and now, as ``OpGraph.compute_dtype`` names it.

    The dtype of an autocast active in this thread for the device the model runs on (its first
    parameter's, else its first input tensor's, device type), else the dtype of its first
    floating parameter (of its first floating input tensor for a model without any), else
    ``"float32"``. An unknown precision raises the core's GraphError when set on the graph.
    """
    floating_params = [p for p in model.parameters() if p.is_floating_point()]
    tensors = list(iter_tensors((tuple(args), dict(kwargs or {}))))
    device = floating_params[0].device if floating_params else (tensors[0].device if tensors else torch.device("cpu"))
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return str(torch.get_autocast_dtype(device.type)).removeprefix("torch.")
    floating = floating_params or [t for t in tensors if t.is_floating_point()]
    return str(floating[0].dtype).removeprefix("torch.") if floating else "float32"


def autocast_for(model: nn.Module, precision: str | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` in ``precision`` on the model's device type for bfloat16 or float16;
    autocast turned off for float32 and float64 (the model computes in its parameters' dtype);
    nothing to do for None (the model runs as called).

    Raises:
        InputError: a 16-bit precision for a model on a device autocast does not run on (meta).
    """
    first = next((p for p in model.parameters() if p.is_floating_point()), None)
    device_type = first.device.type if first is not None else "cpu"
    if precision not in ("bfloat16", "float16"):
        if precision is None or device_type not in ("cpu", "cuda"):
            return contextlib.nullcontext()
        return torch.autocast(device_type, enabled=False)
    if device_type not in ("cpu", "cuda"):
        raise InputError(f"torch.autocast does not run on {device_type} tensors, so {type(model).__name__} cannot "
                         f"be traced computing in {precision} there: convert the model with "
                         f"model.to(torch.{precision}), or trace it on cpu or cuda")
    return torch.autocast(device_type, dtype=getattr(torch, precision))


def _capture(model: nn.Module, args: tuple, kwargs: dict[str, Any], leaf_modules: Iterable[str | type[nn.Module]],
             capture: str, specialized: Any) -> tuple[str, Capture]:
    """The name of the front end that captured the model and its capture: the front end
    ``capture`` names, or for "auto" the first in FRONT_ENDS that captures the model (only those
    that take leaf modules, when some are given); a TraceError names every front end's reason
    when none does."""
    if capture != "auto":
        front_ends = [FRONT_ENDS[capture]]
    else:
        front_ends = [f for f in FRONT_ENDS.values() if f.takes_leaf_modules or not tuple(leaf_modules)]
    errors: list[tuple[FrontEnd, TraceError]] = []
    for front_end in front_ends:
        try:
            captured = front_end.capture(model, args, kwargs, leaf_modules=leaf_modules, specialized=specialized)
        except TraceError as error:
            errors.append((front_end, error))
            continue
        return front_end.name, captured
    if len(errors) == 1:
        raise errors[0][1]
    first = errors[0][1]
    rest = " ".join(f"{front_end.title} failed too: {error}" for front_end, error in errors[1:])
    raise TraceError(f"{first} {rest}") from errors[-1][1]


def _measure(model: nn.Module, gm: fx.GraphModule, values: list[Any]) -> _Recorder:
    """Runs the capture once on the example, recording each operator's flops and output bytes."""
    counter = FlopCounterMode(display=False)
    recorder = _Recorder(gm, counter)
    # The measuring run must not change the model: a training-mode forward would update
    # BatchNorm running statistics (and its batch counter), so buffers are put back afterwards.
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        # On copies of the inputs: a model that writes into its inputs must not change the
        # caller's example batch by being traced.
        # ...and with the random generators put back: the run draws dropout masks, and a rank's
        # later draws must be those the untraced model would have made.
        with torch.random.fork_rng(devices=[]), torch.no_grad(), counter:
            recorder.run(*[copy_tensors(v) for v in values])
    except InputError:
        raise
    except Exception as exc:
        raise TraceError(
            f"running the traced {type(model).__name__} on the example inputs failed: {exc} "
            f"(at {user_frame(exc)}). Check that example_inputs are what forward() expects."
        ) from exc
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return recorder


def _add_nodes(model: nn.Module, gm: fx.GraphModule, traced: TracedModel, recorder: _Recorder, batch: int) -> None:
    """One OpGraph node per operator and model input, with its per-sample flops and bytes and
    the parameters and buffers it owns (a tensor used by several operators is owned by the
    first, listed as shared by the others)."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    owned: set[int] = set()
    attr_values = {node.name: _fetch_attr(gm, str(node.target)) for node in gm.graph.nodes if node.op == "get_attr"}
    for node in gm.graph.nodes:
        # size arithmetic on the inputs (export captures) is computed by every stage that needs it
        if node.op in ("get_attr", "output") or node.meta.get("inputs_only"):
            continue
        info = _C.Node()
        info.name = node.name
        info.op = "input" if node.op == "placeholder" else node.op
        info.target = _target_name(gm, node)
        info.module = _owner(node)
        info.is_input = node.op == "placeholder"
        info.forward_flops = recorder.flops.get(node.name, 0.0) / batch
        info.output_bytes = recorder.out_bytes.get(node.name, 0) / batch
        params: list[tuple[str, torch.Tensor]] = []
        buffers: list[torch.Tensor] = []
        if node.op == "call_module":
            sub = gm.get_submodule(str(node.target))
            params = [(canonical.get(id(p), n), p) for n, p in sub.named_parameters()]
            buffers = list(sub.buffers())
        for arg in node.all_input_nodes:
            if arg.op == "get_attr":
                value = attr_values[arg.name]
                if isinstance(value, nn.Parameter):
                    params.append((canonical.get(id(value), str(arg.target)), value))
                else:
                    buffers.extend(iter_tensors(value))
        _own_state(info, params, buffers, owned)
        traced.node_ids[node.name] = traced.graph.add_node(info)


def _own_state(info: Any, params: list[tuple[str, torch.Tensor]], buffers: list[torch.Tensor], owned: set[int]) -> None:
    """Fills a node's parameter and buffer fields; ``owned``: tensors an earlier node owns."""
    own_names, shared_names, param_bytes, shapes = [], [], 0, []
    for name, p in params:
        if id(p) in owned:
            shared_names.append(name)
        else:
            owned.add(id(p))
            own_names.append(name)
            param_bytes += p.numel() * p.element_size()
            # What the sync pricing needs (cost/sync_cost.h): PowerSGD compresses by shape,
            # the runtime's gradient buckets hold one dtype each and skip frozen parameters.
            shapes.append(_C.ParamShape(name=name, shape=list(p.shape), dtype=str(p.dtype).removeprefix("torch."),
                                        element_size=p.element_size(), requires_grad=p.requires_grad))
    buffer_bytes = 0
    for b in buffers:
        if id(b) not in owned:
            owned.add(id(b))
            buffer_bytes += b.numel() * b.element_size()
    info.params, info.shared_params = own_names, shared_names
    info.param_bytes, info.buffer_bytes = param_bytes, buffer_bytes
    info.param_shapes = shapes


def _add_edges(model: nn.Module, gm: fx.GraphModule, traced: TracedModel, recorder: _Recorder, batch: int) -> None:
    """The OpGraph's edges (each with the per-sample bytes it carries) and outputs."""
    graph = traced.graph
    real_nodes = [n for n in gm.graph.nodes if n.name in traced.node_ids and n.op != "placeholder"]
    if not real_nodes:
        raise TraceError(
            f"{type(model).__name__} has no operators: forward() returns its inputs (or "
            "constants) unchanged, so there is nothing to partition"
        )
    for node in gm.graph.nodes:
        if node.name not in traced.node_ids:
            continue
        dst = traced.node_ids[node.name]
        for arg in node.all_input_nodes:
            if arg.name not in traced.node_ids:
                continue
            # A getitem takes one element of a tuple: the edge carries that element only.
            carried = node if (node.op == "call_function" and node.target is operator.getitem) else arg
            graph.add_edge(traced.node_ids[arg.name], dst, recorder.out_bytes.get(carried.name, 0) / batch)
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    marked = 0
    for arg in output_node.all_input_nodes:
        if arg.name in traced.node_ids:
            graph.set_output(traced.node_ids[arg.name], True)
            marked += 1
    if marked == 0:
        raise TraceError(f"{type(model).__name__} returns no value computed from its operators")


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


def trace(
    model: nn.Module,
    example_inputs: Any,
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    leaf_modules: Iterable[str | type[nn.Module]] = (),
    capture: str = "auto",
) -> Any:
    """Traces ``model`` into an :class:`OpGraph` (the C++ operator DAG).

    Args:
        model: the module to trace; it is not modified.
        example_inputs: a tensor or a tuple of tensors for ``forward``; their leading dimension
            is the batch size (quantities are stored per sample).
        example_kwargs: keyword inputs of ``forward``, if any.
        leaf_modules: qualified module names or module classes to keep as single operators
            (for example a submodule with data-dependent control flow); torch.fx only.
        capture: ``"auto"`` (torch.fx, and torch.export where fx cannot follow the model's
            Python), ``"fx"`` or ``"export"`` (``graphpipe/export_capture.py``).

    Returns:
        The ``OpGraph``: one node per operator with op kind, owning module, forward FLOPs, owned
        parameters (with their shapes and dtypes) and shared ones, output bytes per sample; one
        edge per tensor flow.

    Raises:
        TraceError: the model cannot be traced (the message names the construct and a fix), or
            has no operators.
        InputError: a model that is not an ``nn.Module``, example inputs of the wrong type, or
            outputs that are not tensors / nested tuples, lists or dicts of tensors.
    """
    return trace_module(model, example_inputs, example_kwargs, leaf_modules=leaf_modules, capture=capture).graph
