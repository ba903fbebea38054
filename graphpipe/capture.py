"""The capture front-end interface: how a front end turns a model into the fx ``GraphModule``
that ``graphpipe.trace`` measures and builds the ``OpGraph`` from, and that the runtime cuts
into stage modules.

A front end (``FrontEnd``) captures ``model(*args, **kwargs)`` and yields a ``Capture``: the
graph module, the values of its placeholders for the example, how its inputs are laid out, the
batch it is fixed to if any, and its ``ModeSwitch``, what switching a stage module between
training and eval takes beyond ``module.train(mode)``. ``graphpipe.trace.FRONT_ENDS`` is the one
list of front ends, in the order ``capture="auto"`` tries them: torch.fx
(``graphpipe/fx_capture.py``), then torch.export (``graphpipe/export_capture.py``). A new front
end is a module with a ``FrontEnd`` subclass and one line in that list (docs/extending.md).

Every front end's graph module satisfies what the rest reads: parameters and buffers under the
model's own qualified names (``get_attr`` nodes or module calls), each operator's
``meta["grad_enabled"]``, and in-place writes as edges (``redirect_inplace_uses``, which marks
``meta["inplace"]``).
"""

from __future__ import annotations

import inspect
import linecache
import operator
import os
import traceback
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.fx as fx
from torch import nn

from graphpipe.errors import InputError

__all__ = ["Capture", "FrontEnd", "ModeSwitch", "copy_tensors", "input_leaves", "is_opaque_module", "may_write_inputs",
           "mutates_first_argument", "redirect_inplace_uses", "setitem", "user_frame"]


class ModeSwitch:
    """How the stage modules cut from a capture switch between training and eval. This base is
    a capture whose stage modules run the model's own modules (torch.fx): ``module.train(mode)``,
    which the caller does, is all it takes."""

    def check(self, model_name: str, training: bool) -> None:
        """Raises InputError where the capture cannot run in the mode asked for."""

    def switch(self, module: nn.Module, training: bool) -> None:
        """Switches what ``module.train(mode)`` does not in a stage ``module`` of this capture."""


@dataclass
class Capture:
    """What a front end yields for ``model(*args, **kwargs)``."""

    module: fx.GraphModule
    #: the example's value of every placeholder, in order
    values: list[Any]
    modes: ModeSwitch
    #: the pytree structure of ``(args, kwargs)`` whose leaves are the placeholders; None: one
    #: placeholder per ``forward`` parameter (varargs flattened)
    input_spec: Any = None
    #: the only batch size the capture runs at (the model's code depends on it), None if any
    static_batch: int | None = None
    #: the front end checked that the outputs are pytrees of tensors
    outputs_checked: bool = False


class FrontEnd(ABC):
    """One way of capturing a model (``graphpipe.trace(capture=name)``)."""

    #: ``capture=`` value, and the name error messages use ("torch.fx")
    name: ClassVar[str]
    title: ClassVar[str]
    #: follows ``trace(leaf_modules=)`` (modules kept whole as one operator)
    takes_leaf_modules: ClassVar[bool] = False

    @abstractmethod
    def capture(self, model: nn.Module, args: tuple, kwargs: dict[str, Any], *,
                leaf_modules: Iterable[str | type[nn.Module]], specialized: Mapping[str, Any]) -> Capture:
        """Captures ``model(*args, **kwargs)``; ``specialized``: the ``forward`` arguments that are
        None or Python scalars in the example (fixed at these values). Raises TraceError where the
        model cannot be captured this way, naming why."""


def input_leaves(spec: Any, args: tuple, kwargs: dict[str, Any], model_name: str) -> list[Any]:
    """The leaves of ``(args, kwargs)`` in the order of the placeholders of a capture whose inputs
    are laid out by ``spec`` (``Capture.input_spec``); InputError where they are laid out otherwise."""
    from torch.utils import _pytree as pytree

    keys = list(spec.children()[1].context) if spec.num_children == 2 else []
    if set(kwargs) != set(keys):
        raise InputError(
            f"{model_name} was captured with keyword inputs {sorted(keys)} and is now given {sorted(kwargs)}; "
            "pass the same inputs, positionally or by keyword, as the traced example"
        )
    leaves, given = pytree.tree_flatten((args, {k: kwargs[k] for k in keys}))
    if given != spec:
        raise InputError(
            f"{model_name}'s inputs are structured differently than the traced example's: "
            f"{' '.join(str(given).split())} instead of {' '.join(str(spec).split())}"
        )
    return leaves


def copy_tensors(value: Any) -> Any:
    """``value`` with every tensor in its tuples, lists and dicts cloned (a run on the example
    must not write into the caller's batch)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(copy_tensors(v) for v in value)
    if isinstance(value, Mapping):
        return {k: copy_tensors(v) for k, v in value.items()}
    return value


def setitem(target: torch.Tensor, key: Any, value: Any) -> torch.Tensor:
    """``target[key] = value`` as an operator that returns the tensor it wrote to, so that the
    operators after it can read the written tensor through a graph edge."""
    target[key] = value
    return target


#: Python's augmented assignments; fx traces `x += y` on a proxy as `x = x + y` (a new tensor),
#: but a leaf module or torch function may still be called with these.
_INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift, operator.imatmul, setitem,
})


def mutates_first_argument(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` writes into the tensor it gets as first argument (and returns it):
    ``x.add_(y)``, ``nn.ReLU(inplace=True)``, ``F.relu(x, inplace=True)``, ``torch.relu_(x)``,
    ``x[i] = v``."""
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.startswith("_")
    if node.op == "call_module":
        return getattr(gm.get_submodule(str(node.target)), "inplace", False) is True
    if node.op != "call_function":
        return False
    target = node.target
    schema = getattr(target, "_schema", None)
    if isinstance(target, torch._ops.OpOverload) and schema is not None:
        # an ATen operator (torch.export captures): its schema says what it writes
        first = schema.arguments[0] if schema.arguments else None
        return first is not None and first.alias_info is not None and first.alias_info.is_write
    if target in _INPLACE_OPERATORS:
        return True
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.startswith("_") and getattr(torch, name, None) is target:
        return True
    if getattr(torch.nn.functional, name, None) is target:
        try:
            bound = inspect.signature(target).bind(*node.args, **node.kwargs)
        except (TypeError, ValueError):
            return False
        return bound.arguments.get("inplace") is True
    return False


def is_opaque_module(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A call of a user module kept whole (``leaf_modules``): what it does to its inputs is
    unknown, so it is treated as possibly writing into them."""
    if node.op != "call_module":
        return False
    return not type(gm.get_submodule(str(node.target))).__module__.startswith("torch.nn")


def may_write_inputs(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` may write into its inputs: an in-place write (marked by
    ``redirect_inplace_uses``) or an opaque module. Such an operator must not be handed a leaf
    that needs a gradient (autograd refuses the write), so the runtime gives its stage copies
    of what it receives, and the profile times it on copies too."""
    return bool(node.meta.get("inplace")) or is_opaque_module(gm, node)


def redirect_inplace_uses(gm: fx.GraphModule) -> None:
    """Points every operator that reads a tensor *after* an in-place write to it at the writing
    operator. In one process the two names are the same tensor; in the graph the edge now says
    that the reader depends on the write, so a partition that puts them on different stages
    sends the written value (and no plan can run the reader before the write). Readers before
    the write keep the old edge: they see the value as it was, on any stage."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if not node.args or not isinstance(node.args[0], fx.Node) or not mutates_first_argument(gm, node):
            continue
        node.meta["inplace"] = True
        written = node.args[0]
        for user in list(written.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(written, node)


_GRAPHPIPE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
#: graphpipe's own frames in a capture's traceback (the models under graphpipe/models are user code)
_CAPTURE_FILES = tuple(os.path.join(_GRAPHPIPE_DIR, f) for f in ("trace.py", "capture.py", "fx_capture.py",
                                                                 "export_capture.py"))


def user_frame(exc: BaseException) -> str:
    """'file:line: code' of the innermost frame of the user's code in a traceback."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TORCH_DIR) or path in _CAPTURE_FILES:
            continue
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        return f"{frame.filename}:{frame.lineno}: `{code}`"
    return "an unknown location"
