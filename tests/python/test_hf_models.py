"""Hugging Face ``transformers`` models train under ``graphpipe.wrap`` in one call, captured with
torch.export (torch.fx cannot follow their Python): CLIP with a contrastive loss, GPT-2 with its
embedding tied to the LM head, LLaVA (vision tower, projector, Llama decoder).

Gold rule: N SGD steps on k CPU ranks give the same losses and parameters as single-process
training that accumulates the gradients of the same micro-batches (``hf_models.reference``), in
float64 at a tight tolerance, and ``full_state_dict()`` loads into the plain model with
``strict=True``.

Matrix: {clip, gpt2, llava} x partitioners {graphpipe, metis, sequential} x schedules {1f1b,
zb_graph} x {2, 3, 4} ranks = 54 cases with GRAPHPIPE_FULL_MATRIX=1. By default a rotation: each
model once, its (partitioner, schedule, world) advancing with the day (the cases are in the test
ids), plus GPT-2 on a manual plan that puts its tied embedding and LM head on different stages.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import hf_models as hm

from graphpipe.testing import expect_ok, run_cases, run_ranks

# transformers is a test dependency (scripts/install_deps.sh installs it): without it these
# tests fail here, naming the missing package, rather than being skipped.
hm.import_transformers()

PARTITIONERS = ["graphpipe", "metis", "sequential"]
SCHEDULES = ["1f1b", "zb_graph"]
WORLDS = [2, 3, 4]
STEPS = 2
LR = 0.05
# float64: rounding differences between the pipeline and one process are ~1e-15; a wrong
# gradient, a missed tied-weight sum or a stale parameter is orders of magnitude larger.
TOLERANCE = {"rtol": 1e-9, "atol": 1e-10}


def _matrix() -> list[tuple[str, str, str, int]]:
    full = list(itertools.product(PARTITIONERS, SCHEDULES, WORLDS))
    if os.environ.get("GRAPHPIPE_FULL_MATRIX") == "1":
        return [(name, p, s, w) for name in hm.NAMES for (p, s, w) in full]
    day = datetime.date.today().toordinal()
    return [(name, *full[(day + 7 * i) % len(full)]) for i, name in enumerate(hm.NAMES)]


CASES = _matrix()


def train(name: str, partitioner: str, schedule: str, manual: tuple[tuple[str, int], ...] | None = None,
          dear: tuple[int, ...] = ()) -> dict[str, Any]:
    """On every rank: wrap the model (keyword inputs, the plain model's output to the loss),
    train STEPS SGD steps with the README's loop; the losses, the gathered state (rank 0) and
    which parameters this rank holds. ``dear``: stages of the plan whose split backward is priced
    1.3x their whole one, so that zb_graph may run them whole (B) beside split stages."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace

    case = hm.build(name, STEPS)
    planning: dict[str, Any] = {"partitioner": partitioner}
    if manual is not None:
        # operators no rule names go to their earliest consumer's stage (manual_plan)
        planning = {"plan": manual_plan(trace(case.model, (), case.example), dict(manual), hm.MICRO_BATCHES)}
    if dear:
        plan = graphpipe.plan(trace(case.model, (), case.example), dist.get_world_size(), partitioner,
                              batch_size=hm.BATCH, micro_batches=hm.MICRO_BATCHES)
        stages = list(plan.stages)
        for st in stages:
            half = (0.65 if st.id in dear else 0.5) * st.backward_seconds
            st.backward_input_seconds = st.backward_weight_seconds = half
        plan.stages = stages
        planning = {"plan": plan}
    with graphpipe.wrap(case.model, case.example, case.loss_fn, schedule=schedule, micro_batches=hm.MICRO_BATCHES,
                        timeout=120, **planning) as pipe:
        opt = torch.optim.SGD(pipe.parameters(), lr=LR)
        losses = [pipe.step(inputs, targets, optimizer=opt) for inputs, targets in case.batches]
        state = pipe.full_state_dict()
        out: dict[str, Any] = {"losses": torch.stack(losses), "held": sorted(n for n, _ in pipe.named_parameters()),
                               "stages": pipe.plan.num_stages}
        sched = pipe.schedule  # per stage, the whole backwards (B) its first rank ran
        out["whole"] = [sum(i.kind == graphpipe._C.OpKind.backward for i in sched.instructions(ranks[0]))
                        for ranks in sched.stage_ranks]
        if dist.get_rank() == 0:
            out["state"] = state
        return out


def _world_worker(rank: int, world: int, cases: list[tuple]) -> dict[tuple, Any]:
    return run_cases(train, cases)


@functools.cache
def _reference(name: str) -> dict[str, Any]:
    return hm.reference(name, STEPS, LR)


def _run(world: int, cases: list[tuple]) -> list[Any]:
    return expect_ok(run_ranks(_world_worker, world, cases, timeout=180 + 90 * len(cases)))


def _check(name: str, results: list[Any], key: tuple) -> None:
    ref = _reference(name)
    for r in results:
        got = r.value[key]
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        torch.testing.assert_close(got["losses"], ref["losses"], **TOLERANCE)
    state = results[0].value[key]["state"]
    assert list(state) == list(ref["state"]), "full_state_dict must have the plain model's keys, in order"
    for k, v in state.items():
        torch.testing.assert_close(v, ref["state"][k], **TOLERANCE, msg=lambda m, k=k: f"{k}: {m}")
    hm.build(name, STEPS).model.load_state_dict(state, strict=True)


_VERDICTS: dict[int, dict[tuple, str | None]] = {}


def _verdicts(world: int, selected: list[tuple]) -> dict[tuple, str | None]:
    """Every selected case of ``world`` in one set of rank processes, checked: case -> None or why."""
    if world not in _VERDICTS:
        cases = [(m, p, s) for (m, p, s, w) in selected if w == world]
        try:
            results = _run(world, cases)
        except AssertionError as exc:
            _VERDICTS[world] = {key: str(exc) for key in cases}
            return _VERDICTS[world]
        verdicts: dict[tuple, str | None] = {}
        for key in cases:
            try:
                _check(key[0], results, key)
                verdicts[key] = None
            except AssertionError as exc:
                verdicts[key] = str(exc)
        _VERDICTS[world] = verdicts
    return _VERDICTS[world]


@pytest.mark.parametrize("name,partitioner,schedule,world", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_hf_model_trains_like_one_process(
    name: str, partitioner: str, schedule: str, world: int, request: pytest.FixtureRequest
) -> None:
    selected = [
        tuple(item.callspec.params[k] for k in ("name", "partitioner", "schedule", "world"))
        for item in request.session.items
        if getattr(item, "function", None) is test_hf_model_trains_like_one_process
    ]
    verdict = _verdicts(world, selected)[(name, partitioner, schedule)]
    assert verdict is None, verdict


def test_gpt2_tied_embedding_and_head_on_different_stages() -> None:
    """GPT-2's token embedding (stage 0) and LM head (stage 1) are one parameter: each stage
    holds a copy, their gradients are summed, training is exact."""
    manual = (("transformer.wte", 0), ("transformer.wpe", 0), ("transformer.h.0", 0), ("transformer.h.1", 1),
              ("transformer.ln_f", 1), ("lm_head", 1), ("rebuild_output", 1))
    key = ("gpt2", "manual", "zb_graph", manual)
    results = _run(2, [key])
    _check("gpt2", results, key)
    # both stages hold the tied matrix (under one of its two names), so it crossed the cut
    tied = {"transformer.wte.weight", "lm_head.weight"}
    for r in results:
        assert tied & set(r.value[key]["held"]), (r.rank, r.value[key]["held"])


def test_gpt2_zb_graph_with_a_stage_run_whole_trains_like_one_process() -> None:
    """zb_graph on 3 ranks where the middle stage's split costs more than its whole backward:
    the generator runs that stage's backwards whole (B) while the others split into I and W,
    and training is still exact (the runtime takes B or I/W per stage and micro-batch)."""
    key = ("gpt2", "sequential", "zb_graph", None, (1,))
    results = _run(3, [key])
    _check("gpt2", results, key)
    assert results[0].value[key]["whole"] == [0, hm.MICRO_BATCHES, 0], results[0].value[key]["whole"]


# ---- capture: module names, two towers, fx vs export ---------------------------------------


def _tower(module: str) -> str:
    return module.split(".")[0]


def test_clip_plan_puts_the_towers_on_parallel_stages() -> None:
    """At 4 ranks the graph plan runs CLIP's vision and text towers on stages of which neither
    waits for the other (a shallower stage DAG than the sequential plan), and its table names
    the towers; a manual plan by module name places them."""
    import graphpipe
    from graphpipe.trace import trace_module

    tf = hm.import_transformers()
    torch.manual_seed(0)
    model = tf.CLIPModel(hm.clip_config(hidden=16, layers=2, image=32)).to(torch.float64)
    g = torch.Generator().manual_seed(7)
    inputs = {"input_ids": torch.randint(2, 64, (8, 16), generator=g),
              "pixel_values": torch.randn(8, 3, 32, 32, generator=g, dtype=torch.float64)}
    traced = trace_module(model, (), inputs)
    assert traced.capture == "export"
    graph = traced.graph
    plan = graphpipe.plan(graph, 4, "graphpipe", micro_batches=4, stages_per_rank=1)
    sequential = graphpipe.plan(graph, 4, "sequential", micro_batches=4)
    assert plan.depth < sequential.depth, (plan.to_string(graph), sequential.to_string(graph))
    table = plan.to_string(graph)
    assert "vision_model" in table and "text_model" in table, table
    # a plain print, without the graph, names the towers too: the stages carry their modules
    printed = str(plan)
    assert "vision_model" in printed and "text_model" in printed, printed
    assert [list(st.modules) for st in plan.stages] == [
        list(dict.fromkeys(_tower(graph.node(v).module) for v in st.nodes if graph.node(v).module))
        for st in plan.stages], printed
    towers = [{_tower(graph.node(v).module) for v in st.nodes} - {""} for st in plan.stages]
    vision = [s for s, t in enumerate(towers) if t == {"vision_model"}]
    text = [s for s, t in enumerate(towers) if t == {"text_model"}]
    assert vision and text, table
    reach = {s: {int(e.dst) for e in plan.edges if int(e.src) == s} for s in range(plan.num_stages)}
    for s in reversed(range(plan.num_stages)):  # stages are numbered in a topological order
        reach[s] |= set().union(*(reach[d] for d in list(reach[s])))
    assert any(t not in reach[v] and v not in reach[t] for v in vision for t in text), table

    manual = graphpipe.plan(graph, 3, "manual", manual={"vision_model": 0, "text_model": 1, "": 2}, micro_batches=4)
    for st in manual.stages:
        placed = {_tower(graph.node(v).module) for v in st.nodes if not graph.node(v).is_input}
        assert not placed & {"vision_model", "text_model"} or len(placed & {"vision_model", "text_model"}) == 1
    stage_of = {graph.node(v).name: s for s, st in enumerate(manual.stages) for v in st.nodes}
    tower_stage = {_tower(graph.node(v).module): stage_of[graph.node(v).name]
                   for v in range(graph.num_nodes) if _tower(graph.node(v).module) in ("vision_model", "text_model")}
    assert tower_stage["vision_model"] != tower_stage["text_model"]
    assert manual.depth == 2, manual.to_string(graph)


def test_bert_and_torch_fx_failures_fall_back_to_export() -> None:
    """torch.fx cannot trace BertModel; trace() captures it with torch.export, keeping the
    parameters' names and the modules of its operators; capture='fx' keeps fx's error."""
    import graphpipe
    from graphpipe.trace import trace_module

    tf = hm.import_transformers()
    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=16,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids = torch.randint(0, 64, (4, 7))
    mask = torch.ones(4, 7, dtype=torch.long)
    with pytest.raises(graphpipe.TraceError):
        trace_module(model, (ids,), {"attention_mask": mask}, capture="fx")
    traced = trace_module(model, (ids,), {"attention_mask": mask})
    assert traced.capture == "export"
    modules = {traced.graph.node(v).module for v in range(traced.graph.num_nodes)}
    assert "encoder.layer.1.attention.self.query" in modules, sorted(modules)
    names = {n for v in range(traced.graph.num_nodes) for n in traced.graph.node(v).params}
    assert names == {n for n, _ in model.named_parameters()} - {"pooler.dense.weight", "pooler.dense.bias"} or \
        names == {n for n, _ in model.named_parameters()}, sorted(names)
    # the captured program computes what the model computes, returned in the model's own form
    values = traced.input_values((ids[:2],), {"attention_mask": mask[:2]})
    got = traced.module(*values.values())
    want = model(ids[:2], attention_mask=mask[:2])
    assert type(got) is type(want)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
