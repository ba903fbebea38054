"""The torch.fx capture front end (``capture="fx"``, tried first by ``"auto"``).

``torch.fx.symbolic_trace`` keeps the model's own granularity (one node per leaf-module call such
as ``nn.Linear``, with the parameters it owns and the module's qualified name), which is the unit
a pipeline stage is cut from; its ``GraphModule`` is what ``torch.fx.passes.split_module``
splits into stage modules later; and it needs no real data, so paper-size models traced on the
``meta`` device cost no memory. Stage modules run the model's own modules, so switching them
between training and eval is ``module.train(mode)`` alone (the base ``ModeSwitch``).
Data-dependent Python control flow is rejected; fx's error becomes one that names the offending
line and says how to fix it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from graphpipe.capture import Capture, FrontEnd, ModeSwitch, redirect_inplace_uses, setitem, user_frame
from graphpipe.errors import InputError, TraceError

__all__ = ["FxFrontEnd"]


class FxFrontEnd(FrontEnd):
    """``torch.fx.symbolic_trace`` with graphpipe's tracer (buffers as attributes, no_grad
    blocks recorded, item assignment as an operator, ``leaf_modules`` kept whole)."""

    name = "fx"
    title = "torch.fx"
    takes_leaf_modules = True

    def capture(self, model: nn.Module, args: tuple, kwargs: dict[str, Any], *,
                leaf_modules: Iterable[str | type[nn.Module]], specialized: Mapping[str, Any]) -> Capture:
        gm = _symbolic_trace(model, leaf_modules, specialized)
        return Capture(module=gm, values=_placeholder_values(gm, model, args, kwargs), modes=ModeSwitch())


class _Tracer(fx.Tracer):
    """fx tracer that keeps user-named modules (or module classes) opaque, records buffers read
    directly in ``forward`` as ``get_attr`` nodes under their own names, and records the grad
    mode each operator was traced under.

    Why each: fx by default runs ``self.buffer.clone()`` eagerly during tracing and stores the
    result as an anonymous ``_tensor_constantN`` (the buffer then leaves ``state_dict`` and stops
    following updates); and fx does not record ``torch.no_grad()`` / ``torch.inference_mode()``
    blocks at all, so without the mode in ``node.meta["grad_enabled"]`` the stages would compute
    gradients that single-process training never computes.
    """

    proxy_buffer_attributes = True

    def __init__(self, leaf_modules: Iterable[str | type[nn.Module]] = ()) -> None:
        super().__init__()
        self._leaf_names = {m for m in leaf_modules if isinstance(m, str)}
        self._leaf_types = tuple(m for m in leaf_modules if isinstance(m, type))

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self._leaf_names:
            return True
        if self._leaf_types and isinstance(m, self._leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        # A no_grad()/inference_mode() block really switches the mode while tracing (its
        # __enter__ runs), so the current mode is the mode the operator runs under.
        node.meta["grad_enabled"] = torch.is_grad_enabled()
        return node


def _proxy_setitem(self: fx.Proxy, key: Any, value: Any) -> None:
    # fx proxies do not support item assignment (`x[:, 0] = 0` raises TypeError): record it as a
    # setitem operator; redirect_inplace_uses then points the later readers of `x` at it.
    self.tracer.create_proxy("call_function", setitem, (self, key, value), {})


#: Python's augmented assignments; fx traces `x += y` on a proxy as `x = x + y` (a new tensor),
#: but a leaf module or torch function may still be called with these.
def _symbolic_trace(
    model: nn.Module, leaf_modules: Iterable[Any], specialized: Mapping[str, Any]
) -> fx.GraphModule:
    tracer = _Tracer(leaf_modules)
    had_setitem = "__setitem__" in vars(fx.Proxy)
    fx.Proxy.__setitem__ = _proxy_setitem  # type: ignore[method-assign]
    try:
        # Traced under grad mode whatever the caller's mode, so that only the model's own
        # no_grad() blocks mark operators as gradient-free.
        with torch.enable_grad():
            graph = tracer.trace(model, concrete_args=dict(specialized) or None)
    except Exception as exc:  # fx raises many types; all become TraceError
        where = user_frame(exc)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "control flow" in message or "iteration" in message or "len(" in message or isinstance(
            exc, fx.proxy.TraceError
        ):
            hint = (
                "Data-dependent Python control flow (an `if`/`while` on a tensor value, "
                "iterating over or taking len() of a tensor) cannot be captured in a static "
                "operator graph. Fix: express it with tensor operations (torch.where, masking), "
                "or keep the submodule that contains it opaque with "
                "graphpipe.trace(..., leaf_modules=['<qualified module name>'])."
            )
        else:
            hint = (
                "Fix: make the construct traceable by torch.fx, or keep the submodule that "
                "contains it opaque with graphpipe.trace(..., leaf_modules=['<qualified module name>'])."
            )
        raise TraceError(
            f"cannot trace {type(model).__name__}: {message} (at {where}). {hint}"
        ) from exc
    finally:
        if not had_setitem:
            del fx.Proxy.__setitem__
    # fx guards each specialised argument with an assert operator; the runtime checks them
    # before anything runs instead (they are not work to place on a stage).
    for node in list(graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none":
            graph.erase_node(node)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    redirect_inplace_uses(gm)
    gm.recompile()
    return gm


def _placeholder_values(
    gm: fx.GraphModule, model: nn.Module, args: tuple, kwargs: dict
) -> list[Any]:
    """Positional values for Interpreter.run, in placeholder order (varargs flattened)."""
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        raise InputError(
            f"example inputs do not match {type(model).__name__}.forward: {exc}"
        ) from exc
    bound.apply_defaults()
    # Placeholders follow forward()'s parameters in order (fx renames a specialised one, e.g.
    # `mask` becomes `mask_1`, so names cannot be matched).
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values: list[Any] = []
    for _node, (name, param) in zip(placeholders, inspect.signature(model.forward).parameters.items()):
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            raise InputError(f"{type(model).__name__}.forward takes **{name}; pass keyword inputs by name")
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            values.extend(bound.arguments.get(name, ()))
        else:
            values.append(bound.arguments.get(name))
    return values
