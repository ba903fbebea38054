"""graphpipe.trace: the operator DAG of the example models and of hand-made edge cases."""

from __future__ import annotations

import subprocess
import sys

import networkx as nx
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import graphpipe
from graphpipe.models import build_model

MODELS = ["mmt:branches=4", "dlrm", "candle_uno", "transformer"]


def to_networkx(graph) -> nx.DiGraph:
    g = nx.DiGraph()
    for i in range(graph.num_nodes):
        g.add_node(i)
    for e in graph.edges:
        g.add_edge(e.src, e.dst)
    return g


def node_disjoint_paths(graph, src: str, dst: str) -> int:
    g = to_networkx(graph)
    return len(list(nx.node_disjoint_paths(g, graph.find(src), graph.find(dst))))


@pytest.mark.parametrize("spec", MODELS)
def test_flops_match_flop_counter_on_whole_model(spec: str) -> None:
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(*inputs)
    total = counter.get_total_flops()
    assert total > 0
    assert graph.total_forward_flops() * graph.trace_batch_size == pytest.approx(total, rel=0.01)


@pytest.mark.parametrize("spec", MODELS)
def test_parameter_bytes_match_model(spec: str) -> None:
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    expected = sum(p.numel() * p.element_size() for p in model.parameters())
    assert graph.total_param_bytes() == expected
    owned = [name for node in graph.nodes for name in node.params]
    assert sorted(owned) == sorted(name for name, _ in model.named_parameters())


@pytest.mark.parametrize("spec", MODELS)
def test_graph_is_valid_with_marked_inputs_and_outputs(spec: str) -> None:
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    graph.validate()
    assert graph.inputs() and graph.outputs()
    assert all(graph.node(i).op == "input" for i in graph.inputs())
    assert graph.trace_batch_size == inputs[0].shape[0]
    # Per-sample output bytes of a Linear: out_features * 4 bytes.
    for node in graph.nodes:
        if node.target == "Linear":
            linear = model.get_submodule(node.module)
            assert node.output_bytes * 1 == pytest.approx(
                linear.out_features * 4 * (node.output_bytes / (linear.out_features * 4))
            )
            assert node.output_bytes % (linear.out_features * 4) == 0
            assert node.param_bytes == sum(p.numel() * 4 for p in linear.parameters())


@pytest.mark.parametrize("branches", [2, 4, 7])
def test_mmt_branches_are_node_disjoint_paths(branches: int) -> None:
    model, inputs = build_model(f"mmt:branches={branches}")
    graph = graphpipe.trace(model, inputs)
    assert node_disjoint_paths(graph, "_inputs", "cat") == branches
    assert graph.series_parallel().tree.widest_parallel() >= branches


@pytest.mark.parametrize("branches", [4, 16])
def test_candle_uno_branches(branches: int) -> None:
    model, inputs = build_model(f"candle_uno:branches={branches}")
    graph = graphpipe.trace(model, inputs)
    assert node_disjoint_paths(graph, "_inputs", "cat") == branches
    assert graph.series_parallel().is_series_parallel


def test_dlrm_dense_and_sparse_branches() -> None:
    model, inputs = build_model("dlrm:dense_branches=4,sparse_branches=3")
    graph = graphpipe.trace(model, inputs)
    assert node_disjoint_paths(graph, "dense", "stack") == 4
    assert node_disjoint_paths(graph, "sparse", "stack") == 3
    bags = [n for n in graph.nodes if n.target == "EmbeddingBag"]
    assert len(bags) == 3


def test_sequential_transformer_is_a_chain_of_blocks() -> None:
    model, inputs = build_model("transformer:depth=3")
    graph = graphpipe.trace(model, inputs)
    # The only parallel splits are inside one block (q, k, v); none spans two blocks.
    tree = graph.series_parallel().tree
    for index, node in enumerate(tree.nodes):
        if node.kind == graphpipe._C.SPNode.Kind.parallel:
            blocks = {graph.node(i).module.split(".")[1] for i in tree.leaves(index)}
            assert len(blocks) == 1, blocks
    assert node_disjoint_paths(graph, "x", "head") == 1


def test_owning_module_and_op_kinds() -> None:
    model, inputs = build_model("mmt:branches=2,depth=1")
    graph = graphpipe.trace(model, inputs)
    by_name = {n.name: n for n in graph.nodes}
    assert by_name["branches_0_0_q"].op == "call_module"
    assert by_name["branches_0_0_q"].module == "branches.0.0.q"
    sdpa = by_name["scaled_dot_product_attention"]
    assert sdpa.op == "call_function"
    assert sdpa.target == "torch.nn.functional.scaled_dot_product_attention"
    assert sdpa.module == "branches.0.0"
    assert sdpa.forward_flops > 0
    assert by_name["cat"].target == "torch.cat"


def test_getitem_edge_carries_only_its_element() -> None:
    model, inputs = build_model("candle_uno:branches=4")
    graph = graphpipe.trace(model, inputs)
    src = graph.find("_inputs")
    one_input_bytes = inputs[0][0].numel() * 4
    for e in graph.edges:
        if e.src == src:
            assert e.bytes == pytest.approx(one_input_bytes)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.mid = nn.Linear(16, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.mid(self.emb(tokens)))
        return F.linear(h, self.emb.weight)  # output projection tied to the embedding


def test_tied_weights_are_counted_once() -> None:
    model = TiedLM()
    graph = graphpipe.trace(model, torch.randint(0, 50, (4, 6)))
    assert graph.total_param_bytes() == sum(p.numel() * 4 for p in model.parameters())
    linear = next(n for n in graph.nodes if n.target == "torch.nn.functional.linear")
    assert linear.shared_params == ["emb.weight"]
    assert linear.param_bytes == 0
    emb = next(n for n in graph.nodes if n.target == "Embedding")
    assert emb.params == ["emb.weight"]


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.a(x)
        return x


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Branchy()
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x))


def test_data_dependent_control_flow_gets_a_clear_error() -> None:
    with pytest.raises(graphpipe.TraceError) as info:
        graphpipe.trace(Wrapper(), torch.randn(3, 4))
    message = str(info.value)
    assert "control flow" in message
    assert "if x.sum() > 0" in message  # names the construct
    assert "test_trace.py" in message
    assert "leaf_modules" in message  # suggests a fix
    assert isinstance(info.value, graphpipe.GraphpipeError)


def test_leaf_modules_fix_makes_it_traceable() -> None:
    graph = graphpipe.trace(Wrapper(), torch.randn(3, 4), leaf_modules=["inner"])
    inner = next(n for n in graph.nodes if n.module == "inner")
    assert inner.op == "call_module" and inner.target == "Branchy"
    assert inner.param_bytes == (16 + 4) * 4


def test_keyword_inputs() -> None:
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * scale

    graph = graphpipe.trace(KW(), (torch.randn(2, 3),), {"scale": torch.randn(2, 3)})
    assert {graph.node(i).name for i in graph.inputs()} == {"x", "scale"}


def test_bad_inputs_get_clear_errors() -> None:
    import numpy as np

    with pytest.raises(graphpipe.InputError, match="numpy.ndarray"):
        graphpipe.trace(nn.Linear(2, 2), (np.zeros((2, 2)),))
    with pytest.raises(graphpipe.InputError, match="torch.nn.Module"):
        graphpipe.trace(lambda x: x, torch.zeros(2))
    with pytest.raises(graphpipe.InputError, match="tuple/list of tensors"):
        graphpipe.trace(nn.Linear(2, 2), "not a tensor")
    with pytest.raises(graphpipe.InputError, match="do not match"):
        graphpipe.trace(nn.Linear(2, 2), (torch.zeros(1, 2), torch.zeros(1, 2)))


def test_model_without_operators_is_rejected() -> None:
    with pytest.raises(graphpipe.TraceError, match="no operators"):
        graphpipe.trace(nn.Identity(), torch.zeros(2, 3))


def test_non_tensor_outputs_are_rejected() -> None:
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor):
            return {"y": self.lin(x), "label": "text"}

    with pytest.raises(graphpipe.InputError, match=r"output\['label'\] is a str"):
        graphpipe.trace(Bad(), torch.zeros(2, 2))


def test_nested_tensor_outputs_are_fine() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 3)

        def forward(self, x: torch.Tensor):
            return {"a": self.a(x), "rest": (self.b(x),)}

    graph = graphpipe.trace(Two(), torch.zeros(5, 2))
    assert sorted(graph.node(i).name for i in graph.outputs()) == ["a", "b"]


def test_paper_sizes_trace_on_meta_without_memory() -> None:
    model, inputs = build_model("dlrm:size=paper,device=meta,batch=4")
    graph = graphpipe.trace(model, inputs)
    assert graph.total_param_bytes() == sum(p.numel() * 4 for p in model.parameters())
    assert graph.total_param_bytes() > 3e9


def test_json_round_trip_and_file_errors(tmp_path) -> None:
    model, inputs = build_model("dlrm")
    graph = graphpipe.trace(model, inputs)
    path = tmp_path / "g.json"
    graph.save(str(path))
    back = graphpipe.OpGraph.load(str(path))
    assert back.to_json() == graph.to_json()
    assert back.fingerprint() == graph.fingerprint()
    with pytest.raises(graphpipe.FormatError, match="schema_version"):
        graphpipe.OpGraph.from_json(graph.to_json().replace('"schema_version":1', '"schema_version":7'))
    with pytest.raises(graphpipe.FormatError, match="not valid JSON"):
        graphpipe.OpGraph.from_json("{")


def test_cycle_is_a_graph_error_in_python() -> None:
    g = graphpipe.OpGraph()
    for name in "abc":
        node = graphpipe.Node()
        node.name = name
        g.add_node(node)
    g.add_edge(0, 1, 1.0)
    g.add_edge(1, 2, 1.0)
    g.add_edge(2, 0, 1.0)
    with pytest.raises(graphpipe.GraphError, match="cycle: a -> b -> c -> a"):
        g.topological_order()


def test_summary_and_repr() -> None:
    model, inputs = build_model("candle_uno:branches=4")
    graph = graphpipe.trace(model, inputs)
    assert repr(graph).startswith("<OpGraph CandleUno:")
    text = str(graph)
    assert "series-parallel: yes, widest parallel split: 4" in text
    assert "inputs:  _inputs" in text


def test_log_level_is_validated() -> None:
    graphpipe.set_log_level("info")
    graphpipe.set_log_level("warn")
    with pytest.raises(graphpipe.GraphpipeError, match="unknown log level 'loud'"):
        graphpipe.set_log_level("loud")


def test_cli_inspect(tmp_path) -> None:
    out = tmp_path / "g.json"
    result = subprocess.run(
        [sys.executable, "-m", "graphpipe", "inspect", "candle_uno:branches=3", "--json", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "OpGraph of CandleUno" in result.stdout
    assert graphpipe.OpGraph.load(str(out)).num_nodes > 0
    bad = subprocess.run(
        [sys.executable, "-m", "graphpipe", "inspect", "nosuchmodel"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert bad.returncode == 2 and "unknown model" in bad.stderr


def test_tracing_leaves_batchnorm_statistics_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graphpipe.trace(model, torch.randn(16, 4) * 5 + 3)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
