"""Single-process checks of the runtime's Python pieces: micro-batching, stage splitting (the
stage modules, run one after another, compute the model), plans and schedules."""

from __future__ import annotations

import pytest
import torch
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan
from torch import nn

import graphpipe
from graphpipe._ext import _C
from graphpipe.errors import InputError, PlanningError
from graphpipe.runtime import build_stages, manual_plan, merge, split
from graphpipe.runtime.shape_propagation import ShapePropagation
from graphpipe.runtime.stages import flatten_values, unflatten_values
from graphpipe.trace import trace_module


def test_split_and_merge_nested() -> None:
    batch = {"a": torch.arange(12).reshape(6, 2), "b": (torch.ones(6), 3), "c": torch.tensor(1.0)}
    parts = split(batch, 3)
    assert [p["a"].shape[0] for p in parts] == [2, 2, 2]
    assert parts[1]["b"][1] == 3 and parts[2]["c"].item() == 1.0
    back = merge(parts)
    assert torch.equal(back["a"], batch["a"]) and torch.equal(back["b"][0], batch["b"][0])


def test_split_errors_are_clear() -> None:
    with pytest.raises(InputError, match="does not divide into 4 micro-batches"):
        split(torch.ones(6, 2), 4)
    with pytest.raises(InputError, match="different leading"):
        split((torch.ones(6), torch.ones(4)), 2)


def _run_stages_in_order(graph, values):
    env = {}
    out = None
    for st in graph.stages:
        args = [values[name] for name in st.placeholders]
        for e in sorted(st.in_values):
            args.extend(env[name] for name in st.in_values[e])
        res = st.module(*args)
        pos = 0
        for e in sorted(st.out_values):
            for name in st.out_values[e]:
                env[name] = res[pos]
                pos += 1
        if st.is_output:
            out = res[-1]
    return out


@pytest.mark.parametrize("name,world", [("mmt", 3), ("dlrm", 4), ("candle_uno", 2), ("transformer", 4)])
def test_stage_modules_compose_to_the_model(name: str, world: int) -> None:
    model, example, batches = make_model(name)
    traced = trace_module(model, example)
    plan = hand_plan(model, example, world)
    graph = build_stages(traced.module, plan, traced.graph)
    assert len(graph.stages) == world
    # original parameter names, each parameter in exactly one stage
    names = [k for st in graph.stages for k, _ in st.module.named_parameters()]
    assert sorted(names) == sorted(k for k, _ in model.named_parameters())
    inputs = batches[0][0]
    placeholders = [n.name for n in traced.module.graph.nodes if n.op == "placeholder"]
    values = dict(zip(placeholders, [tuple(inputs)] if name in ("mmt", "candle_uno") else list(inputs)))
    torch.testing.assert_close(_run_stages_in_order(graph, values), model(*inputs))
    # the wire layout round-trips every crossing value
    layouts, out = ShapePropagation(traced.module, torch.device("cpu")).layouts(graph, len(plan.edges), values)
    assert out.shape[0] == inputs[0].shape[0]
    for e, layout in enumerate(layouts):
        assert len(layout.trees) == sum(len(st.out_values.get(e, ())) for st in graph.stages)
        fake = [torch.zeros(s.shape, dtype=s.dtype) for s in layout.specs]
        assert len(flatten_values(unflatten_values(layout, fake))) == len(fake)


class _Skip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(64, 64) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.d(self.c(self.b(h)) + h)


def test_chain_relays_are_the_cpp_plans() -> None:
    """A chain plan (the sequential partitioner's) has only edges k -> k + 1: the skip value
    ``a`` rides on both, as the C++ plan's edges say (plan_io.h implied_stage_edges), so the
    middle stage receives it and sends it on; the stages still compose to the model."""
    torch.manual_seed(0)
    model = _Skip()
    x = torch.randn(8, 64)
    traced = trace_module(model, (x,))
    plan = graphpipe.plan(traced.graph, 3, "sequential", micro_batches=2, replicate=False)
    assert plan.chain and [(e.src, e.dst) for e in plan.edges] == [(0, 1), (1, 2)]
    cut = build_stages(traced.module, plan, traced.graph)
    assert [st.operators for st in cut.stages] == [["a"], ["b", "c"], ["add", "d"]]
    assert cut.stages[1].in_values == {0: ["a"]} and cut.stages[1].out_values == {1: ["a", "c"]}
    assert cut.stages[2].in_values == {1: ["a", "c"]}
    torch.testing.assert_close(_run_stages_in_order(cut, {"x": x}), model(x))


def test_manual_rules_are_matched_by_cpp() -> None:
    """manual_plan reads which rule covers an operator from the C++ manual partitioner
    (``_C.manual_rule_stages``): the longest rule wins, "" covers every operator but the inputs;
    an operator no rule covers (``add``) follows its earliest consumer."""
    traced = trace_module(_Skip(), (torch.randn(2, 64),))
    graph = traced.graph
    names = [graph.node(v).name for v in range(graph.num_nodes)]
    ruled = dict(zip(names, _C.manual_rule_stages(graph, [("b", 1), ("", 0)])))
    assert ruled == {"x": -1, "a": 0, "b": 1, "c": 0, "add": 0, "d": 0}
    assert dict(zip(names, _C.manual_rule_stages(graph, [("a", 0), ("d", 1)])))["add"] == -1
    plan = manual_plan(graph, {"a": 0, "b": 0, "c": 1, "d": 1}, 2)
    assert [[graph.node(v).name for v in st.nodes] for st in plan.stages] == [["x", "a", "b"], ["c", "add", "d"]]


def test_plan_must_cover_every_operator() -> None:
    model, example, _ = make_model("candle_uno")
    traced = trace_module(model, example)
    plan = hand_plan(model, example, 2)
    stages = plan.stages  # a copy: edit it and set it back
    stages[0].nodes = stages[0].nodes[:-1]
    plan.stages = stages
    # The C++ validator refuses it, with the message graphpipe.Plan.validate gives.
    with pytest.raises(PlanningError) as caught:
        plan.validate(traced.graph)
    with pytest.raises(PlanningError) as refused:
        build_stages(traced.module, plan, traced.graph)
    assert str(refused.value) == str(caught.value)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_parameters_shared_across_stages_are_listed() -> None:
    """A tied parameter on two stages: each stage module holds it under its own name there, and
    the stage graph lists both so that the pipeline can sum their gradients."""
    model = _Tied()
    traced = trace_module(model, (torch.ones(2, 4),))
    plan = manual_plan(traced.graph, {"a": 0, "relu": 0, "b": 1}, 2)
    graph = build_stages(traced.module, plan, traced.graph)
    assert graph.shared_params == {"a.weight": {0: "a.weight", 1: "b.weight"}}
    same = build_stages(traced.module, manual_plan(traced.graph, {"a": 0, "relu": 0, "b": 0}, 2), traced.graph)
    assert same.shared_params == {}


def test_manual_plan_is_a_checked_cpp_plan() -> None:
    """manual_plan goes through the C++ manual partitioner: a Plan (stage times from the cost
    model, stage edges from the graph), and a bad mapping is the partitioner's PlanningError."""
    model, example, _ = make_model("candle_uno")
    traced = trace_module(model, example)
    plan = hand_plan(model, example, 2)
    assert isinstance(plan, _C.Plan) and plan.partitioner == "manual"
    assert plan.num_stages == 2 and [list(st.devices) for st in plan.stages] == [[0], [1]]
    assert all(st.forward_seconds > 0 and st.backward_seconds > 0 for st in plan.stages)
    assert [(e.src, e.dst) for e in plan.edges] == [(0, 1)]
    plan.validate(traced.graph)
    with pytest.raises(PlanningError, match="receives no operator"):
        manual_plan(traced.graph, {"": 0, "nothing": 2}, 2)


def test_timings_carry_their_instruction() -> None:
    """The measured-trace reader takes kind, stage, micro-batch and edge from the timing's
    instruction (no token parsing)."""
    from graphpipe.runtime.measure import tasks_from_timings

    class Timing:  # an InstructionTiming's fields
        def __init__(self, token: str, start: float, end: float) -> None:
            ins = _C.Instruction.parse(token)
            self.instruction, self.start, self.end = ins, start, end
            self.kind, self.stage, self.micro_batch, self.edge = ins.kind, ins.stage, ins.micro_batch, ins.edge

    timings = [Timing(t, i, i + 0.5) for i, t in enumerate(["0F0", "0SF0e0", "0RB0e0", "0B0", "0OPT"])]
    tasks = tasks_from_timings(timings, 0, [(0, 1)], [[0], [1]])
    assert [(t["name"], t["kind"], t["peer"]) for t in tasks] == [
        ("F0 s0", "forward", -1), ("A0 e0", "activation", 1), ("B0 s0", "backward", -1), ("OPT s0", "optimizer", -1)]
    assert tasks[3]["micro_batch"] == -1 and tasks[1]["edge"] == 0


def test_error_classes() -> None:
    import graphpipe

    assert issubclass(graphpipe.PipelineTimeout, graphpipe.PeerError)
    assert issubclass(graphpipe.PeerError, graphpipe.GraphpipeError)
    assert issubclass(graphpipe.TransferMismatch, graphpipe.GraphpipeError)


def test_wrap_needs_a_process_group() -> None:
    import graphpipe

    model, example, _ = make_model("candle_uno")
    with pytest.raises(InputError, match="init_process_group"):
        graphpipe.wrap(model, example, nn.MSELoss())


def test_wrap_options_are_declared_once() -> None:
    """wrap and Pipeline take WrapOptions (or its fields as keywords): each field is typed and
    documented there once; any other keyword is a planning option."""
    import dataclasses
    import inspect

    from graphpipe.runtime.options import WrapOptions
    from graphpipe.runtime.pipeline import Pipeline, wrap

    for fn in (wrap, Pipeline.__init__):
        params = [p for p in inspect.signature(fn).parameters if p != "self"]
        assert params == ["model", "example_inputs", "loss_fn", "options", "keywords"]
    doc = WrapOptions.__doc__ or ""
    for f in dataclasses.fields(WrapOptions):
        assert f"        {f.name}:" in doc, f"WrapOptions.{f.name} is not documented"
        assert f.type, f.name
    options = WrapOptions.from_keywords(None, schedule="zb_graph", memory_limit="1GB")
    assert options.schedule == "zb_graph" and dict(options.plan_options) == {"memory_limit": "1GB"}
    again = WrapOptions.from_keywords(options, micro_batches=4, seed=1)
    assert (again.schedule, again.micro_batches) == ("zb_graph", 4)
    assert dict(again.plan_options) == {"memory_limit": "1GB", "seed": 1}
    with pytest.raises(InputError, match="options must be a graphpipe.WrapOptions"):
        WrapOptions.from_keywords(object())
    with pytest.raises(InputError, match="bucket_bytes must be positive"):
        WrapOptions(bucket_bytes=0).bucket_size()
    with pytest.raises(InputError, match="plan= was given"):
        WrapOptions(plan="{}", devices=2).refuse_ignored_planning()
