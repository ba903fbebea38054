"""Cuts a traced model into one fx stage module per plan stage and wires the values between them.

Each operator (fx node) goes to the stage the plan puts it in. A value that an operator of stage
``c`` reads from an operator of stage ``p != c`` crosses the stage edge ``p -> c`` (edges that
skip stages, several producers and consumers all follow from this rule; a value read by two
stages travels on two edges). Model inputs (placeholders) never travel: every rank has the batch
and each stage reads the inputs it needs. Parameters and buffers read through ``get_attr`` are
held by every stage that reads them, under their original names. A parameter used by several
stages (tied weights) is held by each of them; ``StageCut.shared_params`` lists it, and the
pipeline sums its gradient over those stages' ranks before the optimizer step.

The stage topology is the C++ Plan's, not recomputed here: which values ride on which stage edge
is read from ``plan.edges[e].edges`` (the operator edges each stage edge carries, as the C++
loader derives them, plan_io.h ``implied_stage_edges``), so a chain plan's relays of values that
skip stages are exactly the ones the cost model charged and the executor transfers.

Faithfulness rules kept here (the tracer marks the operators, see ``graphpipe.trace``):

- grad mode: operators traced inside ``torch.no_grad()`` / ``torch.inference_mode()`` run with
  gradients off in their stage; the mode is switched where it changes and restored at the end of
  the stage, wherever the cuts fall;
- in-place writes: a stage that writes into a tensor in place (or calls a user leaf module,
  whose writes are unknown) gets copies of its received activations, since autograd refuses
  in-place writes to the leaf a received activation is; and a value that the stage sends on but
  later overwrites in place is sent as it was when computed (a copy taken right then), as a
  reader on another stage saw it in one process.

A stage module is an ``fx.GraphModule`` built on the original traced module as root, so it holds
the original submodules and parameters under their original qualified names; it takes
``(*placeholders, *values of each incoming edge)`` and returns
``(*values of each outgoing edge, model output if it is the output stage)``.

This is what ``torch.fx.passes.split_module`` does, written out so that the order of every
stage's inputs and outputs is fixed by the plan's edge order (both ends of an edge must agree on
it); O(nodes + edges).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from graphpipe.capture import may_write_inputs
from graphpipe.errors import PlanningError

__all__ = ["EdgeLayout", "LocalStage", "StageCut", "StageModule", "build_stages", "hold_unused_state",
           "holding_module", "keep_local_stages", "local_module", "edge_layouts", "stage_device", "NO_PARAMETERS"]


class _TensorSlot:
    """Marks where a transferred tensor goes back into a value's pytree."""


_SLOT = _TensorSlot()


@dataclass
class StageModule:
    index: int
    ranks: list[int]                                          # its replicas, the lead first
    placeholders: list[str]                                   # model inputs it reads
    in_values: dict[int, list[str]] = field(default_factory=dict)   # edge -> values received
    out_values: dict[int, list[str]] = field(default_factory=dict)  # edge -> values sent
    is_output: bool = False                                   # computes the model output
    module: fx.GraphModule | None = None
    operators: list[str] = field(default_factory=list)
    #: writes in place (or calls an opaque module): received activations are handed over as copies
    copies_received: bool = False


@dataclass
class StageCut:
    """The traced module cut into the plan's stages. It holds no topology of its own: stage
    edges are the plan's (``plan.edges``, indices into which key ``in_values``/``out_values``)."""

    stages: list[StageModule]
    output_stage: int
    #: parameters held by several stages: canonical name -> {stage: name in that stage's module}
    shared_params: dict[str, dict[int, str]] = field(default_factory=dict)
    #: some operator writes in place: every micro-batch of the inputs must be its own tensor
    #: (micro-batches cut from one batch share its version counter)
    copies_inputs: bool = False


def _wire_values(plan: Any, graph: Any, stages: list[StageModule], compute: set[str]) -> None:
    """Fills every stage's ``in_values``/``out_values`` from the plan's stage edges: an operator
    edge that a stage edge carries sends its producer's value (once per stage edge, however many
    consumers read it). Model inputs never travel (every rank has the batch), so an edge that
    carries only inputs transfers nothing."""
    for e, stage_edge in enumerate(plan.edges):
        src, dst = int(stage_edge.src), int(stage_edge.dst)
        for op_edge in stage_edge.edges:
            name = graph.node(graph.edge(int(op_edge)).src).name
            if name not in compute:
                continue
            received = stages[dst].in_values.setdefault(e, [])
            if name not in received:
                received.append(name)
                stages[src].out_values.setdefault(e, []).append(name)


@dataclass
class _Users:
    """Which stages use what: parameters (by identity, each stage's local name) and state that
    a stage updates (batch norm statistics, buffers written in place)."""

    params: dict[int, dict[int, str]] = field(default_factory=dict)   # id(parameter) -> {stage: name}
    stateful: dict[str, set[int]] = field(default_factory=dict)       # module or buffer -> stages


def build_stages(gm: fx.GraphModule, plan: Any, graph: Any) -> StageCut:
    """Stage modules of ``gm`` for ``plan`` (a C++ Plan of ``graph``, the OpGraph traced from
    ``gm``). The plan is validated against the graph by the C++ validator first, so every
    operator has a stage and every value that crosses stages has its stage edge."""
    plan.validate(graph)
    nodes = list(gm.graph.nodes)
    # Size arithmetic on the inputs alone (export captures): no operator of the plan; every stage
    # that needs a value of it computes it from the inputs, which every rank has.
    inputs_only = {n.name: n for n in nodes if n.meta.get("inputs_only")}
    compute = [n for n in nodes if n.op not in ("placeholder", "get_attr", "output") and n.name not in inputs_only]
    node_stage = _node_stages(plan, graph, compute)
    stages = [
        StageModule(index=s, ranks=[int(d) for d in st.devices], placeholders=[]) for s, st in enumerate(plan.stages)
    ]
    getattrs: dict[int, set[str]] = {s: set() for s in range(len(stages))}  # and inputs_only nodes
    users = _Users()
    for n in compute:
        _assign(gm, n, node_stage[n.name], stages, inputs_only, getattrs, users)
    _attribute_users(gm, nodes, getattrs, users)
    _refuse_split_state(users)
    canonical = {id(p): name for name, p in gm.named_parameters()}
    shared = {canonical.get(pid, min(by.values())): by for pid, by in users.params.items() if len(by) > 1}
    _wire_values(plan, graph, stages, {n.name for n in compute})
    order = {n.name: i for i, n in enumerate(nodes)}
    for st in stages:
        st.placeholders.sort(key=order.__getitem__)
        for values in (*st.in_values.values(), *st.out_values.values()):
            values.sort(key=order.__getitem__)
    output_node = next(n for n in nodes if n.op == "output")
    out_stage = _output_stage(output_node, node_stage)
    stages[out_stage].is_output = True
    for st in stages:
        st.module = _stage_module(gm, st, nodes, getattrs[st.index], output_node)
    return StageCut(
        stages=stages,
        output_stage=out_stage,
        shared_params=dict(sorted(shared.items())),
        copies_inputs=any(may_write_inputs(gm, n) for n in compute),
    )


def _node_stages(plan: Any, graph: Any, compute: list[fx.Node]) -> dict[str, int]:
    """The plan's stage of every operator, by name; PlanningError for an operator it misses."""
    node_stage: dict[str, int] = {}
    for s, stage in enumerate(plan.stages):
        for v in stage.nodes:
            node_stage[graph.node(v).name] = s
    for n in compute:
        if n.name not in node_stage:
            raise PlanningError(
                f"the plan puts operator {n.name!r} in no stage; it was made for another graph "
                "(re-run the partitioner on this model)"
            )
    return node_stage


def _assign(gm: fx.GraphModule, n: fx.Node, s: int, stages: list[StageModule], inputs_only: dict[str, fx.Node],
            getattrs: dict[int, set[str]], users: _Users) -> None:
    """Puts operator ``n`` in stage ``s``: the model inputs and attributes it reads (through
    inputs-only arithmetic too), the parameters and state its module uses."""
    stages[s].operators.append(n.name)
    inputs = list(n.all_input_nodes)
    while any(a.name in inputs_only for a in inputs):
        for a in [a for a in inputs if a.name in inputs_only]:
            inputs.remove(a)
            getattrs[s].add(a.name)
            inputs.extend(a.all_input_nodes)
    for a in inputs:
        if a.op == "placeholder":
            if a.name not in stages[s].placeholders:
                stages[s].placeholders.append(a.name)
        elif a.op == "get_attr":
            getattrs[s].add(a.name)
    if n.op == "call_module":
        sub = gm.get_submodule(str(n.target))
        for pname, p in sub.named_parameters(remove_duplicate=False):
            users.params.setdefault(id(p), {}).setdefault(s, f"{n.target}.{pname}")
        if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and sub.track_running_stats:
            users.stateful.setdefault(f"module {n.target!r} ({type(sub).__name__})", set()).add(s)
    if may_write_inputs(gm, n):
        stages[s].copies_received = True


def _attribute_users(gm: fx.GraphModule, nodes: list[fx.Node], getattrs: dict[int, set[str]], users: _Users) -> None:
    """Records the stages that read each parameter through ``get_attr``, and that write a
    buffer in place."""
    for s, names in getattrs.items():
        for n in nodes:
            if n.name in names and n.op == "get_attr":
                value = gm
                for atom in str(n.target).split("."):
                    value = getattr(value, atom)
                if isinstance(value, torch.nn.Parameter):
                    users.params.setdefault(id(value), {}).setdefault(s, str(n.target))
                else:
                    for user in n.users:
                        if user.meta.get("inplace") and user.args[0] is n:
                            users.stateful.setdefault(f"buffer {n.target!r} (written in place)", set()).add(s)


def _refuse_split_state(users: _Users) -> None:
    """PlanningError for state updated on several stages (each rank's copy would diverge)."""
    for what, stages in users.stateful.items():
        if len(stages) > 1:
            raise PlanningError(
                f"the plan puts users of {what} on stages {sorted(stages)}; each stage's rank would "
                "update its own copy of that state and the copies would diverge. Put those "
                "operators in one stage (graphpipe.runtime.manual_plan, or another partitioner)"
            )


def _output_stage(output_node: fx.Node, node_stage: Mapping[str, int]) -> int:
    """The one stage that computes the model output (PlanningError if several do)."""
    producers = {node_stage[a.name] for a in output_node.all_input_nodes if a.name in node_stage}
    if len(producers) != 1:
        raise PlanningError(
            f"the model output is computed by stages {sorted(producers)}; graphpipe's runtime needs "
            "one stage to produce every output (it computes the loss there)"
        )
    return producers.pop()


def _stage_module(
    gm: fx.GraphModule,
    st: StageModule,
    nodes: list[fx.Node],
    getattrs: set[str],
    output_node: fx.Node,
) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    sent = {name for values in st.out_values.values() for name in values}
    mine = set(st.operators) | getattrs
    # Sent values that an operator of this stage later overwrites in place: sent as computed.
    overwritten = {
        n.args[0].name for n in nodes
        if n.name in mine and n.meta.get("inplace") and n.args and isinstance(n.args[0], fx.Node)
    } & sent
    snapshot: dict[str, fx.Node] = {}

    def define(name: str, node: fx.Node) -> None:
        env[name] = node
        if name in overwritten:
            snapshot[name] = graph.call_method("clone", (node,))

    for name in st.placeholders:
        define(name, graph.placeholder(name))
    for e in sorted(st.in_values):
        for name in st.in_values[e]:
            define(name, graph.placeholder(name))
    # Grad mode: the caller's mode where the model had it on, off inside its no_grad blocks.
    outer: fx.Node | None = None
    grad_on = True
    for n in nodes:
        if n.name not in mine:
            continue
        wanted = n.op == "get_attr" or n.meta.get("grad_enabled", True)
        if wanted != grad_on:
            if outer is None:
                outer = graph.call_function(torch.is_grad_enabled)
            graph.call_function(torch._C._set_grad_enabled, (outer if wanted else False,))
            grad_on = wanted
        define(n.name, graph.node_copy(n, lambda a: env[a.name]))
    if not grad_on:
        graph.call_function(torch._C._set_grad_enabled, (outer,))
    env.update(snapshot)
    results: list[Any] = []
    for e in sorted(st.out_values):
        results.extend(env[name] for name in st.out_values[e])
    if st.is_output:
        results.append(fx.map_arg(output_node.args[0], lambda a: env[a.name]))
    graph.output(tuple(results))
    graph.lint()
    return fx.GraphModule(gm, graph, f"{type(gm).__name__}Stage{st.index}")


def hold_unused_state(graph: StageCut, model: torch.nn.Module) -> list[str]:
    """Gives the output stage the model's parameters and buffers that no operator reads (a layer
    its forward skips, LLaVA's unused vision ``post_layernorm``), under their names: they never
    change, but the pipeline's state dicts must still hold them, so a checkpoint loads into the
    plain model with ``strict=True``. Call it before the other stages' modules are dropped.
    Returns their names."""
    from torch.fx.graph_module import _copy_attr

    held: set[int] = set()
    for st in graph.stages:
        held.update(id(t) for t in st.module.state_dict(keep_vars=True).values())
    unused = [k for k, t in model.state_dict(keep_vars=True).items() if id(t) not in held]
    target = graph.stages[graph.output_stage].module
    for name in unused:
        _copy_attr(model, target, name)
    return unused


def keep_local_stages(cut: StageCut, model: torch.nn.Module, rank: int) -> list[StageModule]:
    """The stages that ``rank`` runs (none, one, or several that each run on it alone), after
    dropping every other stage's module (and so its parameters) from ``cut``; the model's unused
    state is held first."""
    hold_unused_state(cut, model)
    mine = [st for st in cut.stages if rank in st.ranks]
    for st in cut.stages:
        if st not in mine:
            st.module = None
    return mine


#: The name of a parameter-free stage's placeholder parameter (:func:`local_module`).
NO_PARAMETERS = "graphpipe_no_parameters"


def local_module(stages: list[StageModule]) -> torch.nn.Module:
    """The module this rank runs: its stage's; with several stages, one module holding all of
    their state under the model's names (:func:`holding_module`); an empty one on a rank without
    a stage. A module without parameters gets one empty, frozen placeholder, so that torch's
    optimizers, which refuse an empty list, can be built over ``pipe.parameters()`` on every rank
    (it never gets a gradient, so never changes)."""
    if len(stages) == 1:
        module = stages[0].module
    else:
        module = holding_module([st.module for st in stages]) if stages else torch.nn.Module()
    if not any(True for _ in module.parameters()):
        module.register_parameter(NO_PARAMETERS, torch.nn.Parameter(torch.empty(0), requires_grad=False))
    return module


def holding_module(modules: list[torch.nn.Module]) -> torch.nn.Module:
    """One module holding the submodules, parameters and buffers of several stage modules of one
    rank under their names in the model. Stage modules are built on the traced module as root,
    so two stages that use one parameter (tied weights) hold the same tensor: it is one
    parameter here, its gradient the sum of both stages' uses, and ``train()``/``eval()`` reach
    the very submodules the stages call."""
    from torch.fx.graph_module import _copy_attr

    holder = torch.nn.Module()
    # Whole submodules first, so that a parameter's path then runs into the one already copied.
    for module in modules:
        for node in module.graph.nodes:
            if node.op == "call_module":
                _copy_attr(module, holder, str(node.target))
    for module in modules:
        for name, _ in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
            _copy_attr(module, holder, name)
    return holder


@dataclass
class LocalStage:
    """This rank's share of a cut: its stages (none, one, or several that each run on this rank
    alone), the module holding their state (the stage's own module with one stage, see
    :func:`local_module`), and the cut, whose other stages' modules are gone
    (:func:`keep_local_stages`)."""

    cut: StageCut
    stages: list[StageModule]
    module: torch.nn.Module

    @classmethod
    def keep(cls, cut: StageCut, model: torch.nn.Module, rank: int) -> LocalStage:
        """``rank``'s share of ``cut`` (dropping every other stage's module)."""
        stages = keep_local_stages(cut, model, rank)
        return cls(cut, stages, local_module(stages))

    @property
    def stage(self) -> StageModule | None:
        """The first of this rank's stages (None without one)."""
        return self.stages[0] if self.stages else None

    @property
    def index(self) -> int:
        """The first stage's index (-1 without one)."""
        return self.stages[0].index if self.stages else -1

    @property
    def ranks(self) -> list[int]:
        """The ranks that run this rank's stages, the lead replica first ([] without one; a
        rank with several stages runs each of them alone)."""
        return [int(r) for r in self.stages[0].ranks] if self.stages else []

    @property
    def replicated(self) -> bool:
        """Whether several ranks run this stage (data parallel over its rows)."""
        return len(self.ranks) > 1

    @property
    def output_ranks(self) -> list[int]:
        """The ranks of the stage that computes the model output (and the loss)."""
        return list(self.cut.stages[self.cut.output_stage].ranks)

    def stage_module(self, index: int | None = None) -> torch.nn.Module:
        """The module of this rank's stage ``index`` (default: its first)."""
        return self._find(index).module

    def swap(self, module: torch.nn.Module, index: int | None = None) -> int:
        """Runs ``module`` in place of the module of stage ``index`` (default: the first);
        returns the stage's index. With several stages, :attr:`module` becomes a ``ModuleDict``
        of the stages' modules by index: a stand-in (emulation) need not hold the model's
        names."""
        stage = self._find(index)
        stage.module = module
        if len(self.stages) == 1:
            self.module = module
        else:
            self.module = torch.nn.ModuleDict({str(st.index): st.module for st in self.stages})
        return stage.index

    def _find(self, index: int | None) -> StageModule:
        found = [st for st in self.stages if index is None or st.index == index]
        if not found:
            raise PlanningError(f"this rank runs stages {[st.index for st in self.stages]}, not stage {index}")
        return found[0]


def stage_device(module: torch.nn.Module, device: Any) -> torch.device:
    """Where a stage runs: ``device`` if given, else where its parameters are (CPU if none)."""
    if device is not None:
        return torch.device(device)
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


@dataclass
class EdgeLayout:
    """How the values of one stage edge become tensors on the wire at one micro-batch size."""

    specs: list[torch.Tensor]          # meta tensors: shape and dtype of each tensor sent
    trees: list[Any]                   # per value: (treespec, leaves), _SLOT where a tensor goes


def edge_layouts(cut: StageCut, num_edges: int, values: Mapping[str, Any]) -> list[EdgeLayout]:
    """The layout of each of the plan's ``num_edges`` stage edges, given the value of every node
    a stage sends (one micro-batch's, from shape propagation: shape_propagation.py)."""
    layouts: list[EdgeLayout] = [EdgeLayout([], []) for _ in range(num_edges)]
    for st in cut.stages:
        for e, names in st.out_values.items():
            for name in names:
                leaves, spec = pytree.tree_flatten(values[name])
                kept = []
                for leaf in leaves:
                    if isinstance(leaf, torch.Tensor):
                        layouts[e].specs.append(torch.empty(leaf.shape, dtype=leaf.dtype, device="meta"))
                        kept.append(_SLOT)
                    else:
                        kept.append(leaf)
                layouts[e].trees.append((spec, kept))
    return layouts


def flatten_values(values: list[Any]) -> list[torch.Tensor]:
    """The tensors of a list of values, in pytree order (what goes on the wire)."""
    out: list[torch.Tensor] = []
    for v in values:
        out.extend(t for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor))
    return out


def unflatten_values(layout: EdgeLayout, tensors: list[torch.Tensor]) -> list[Any]:
    """Inverse of :func:`flatten_values` for one edge."""
    it = iter(tensors)
    values = []
    for spec, kept in layout.trees:
        leaves = [next(it) if leaf is _SLOT else leaf for leaf in kept]
        values.append(pytree.tree_unflatten(leaves, spec))
    return values
