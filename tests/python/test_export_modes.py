"""Train and eval mode for models captured with torch.export: ``pipe.eval()`` switches each
stage's exported dropout, attention dropout and batch norm to eval, ``pipe.train()`` back.

Gold rules, on 2 CPU ranks in float64: the pipeline's eval outputs equal the plain model's
``model.eval()`` outputs at a tight tolerance (a BERT with hidden and attention dropout 0.1, and
a network with batch norm whose running statistics the training steps changed); training after
an eval gives the parameters and buffers (running statistics, batch counters) of one process
that trains on the same micro-batches and evaluates in between. A model whose Python code
branches on ``self.training`` beyond dropout and batch norm is refused by ``pipe.eval()`` with
an error that says so, and a capture in eval mode by ``pipe.train()``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
import hf_models as hm

from graphpipe.testing import run_ranks

hm.import_transformers()

WORLD = 2
BATCH = 8
MICRO_BATCHES = 4
LR = 0.05
TOLERANCE = {"rtol": 1e-9, "atol": 1e-10}


def _bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny BERT with hidden and attention dropout 0.1 (SDPA attention: its dropout_p is a
    Python branch on self.training in transformers) and its keyword inputs."""
    tf = hm.import_transformers()
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.1,
                           attention_probs_dropout_prob=0.1)
    model = tf.BertModel(config).to(torch.float64)
    g = torch.Generator().manual_seed(3)
    inputs = {"input_ids": torch.randint(0, 64, (BATCH, 7), generator=g),
              "attention_mask": torch.ones(BATCH, 7, dtype=torch.long)}
    return model, inputs


class TwoBranchBN(nn.Module):
    """Two convolutional branches with batch norm (and dropout with p=0, so that training is
    deterministic and its mode flag still switches), joined by a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.0))
        self.b = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.3), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.cat([self.a(x).mean((2, 3)), self.b(x).mean((2, 3))], dim=1)
        return self.head(feats)


class BranchesOnTraining(nn.Module):
    """Returns probabilities in eval mode only: a Python branch on self.training that the
    capture fixes, and that switching dropout and batch norm cannot change."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 6)
        self.l2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l2(torch.relu(self.l1(x)))
        return y if self.training else y.softmax(-1)


def _bn_data() -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(BATCH, 3, 6, 6, generator=g, dtype=torch.float64),
                torch.randint(0, 5, (BATCH,), generator=g)) for _ in range(2)]
    return batches, torch.randn(BATCH, 3, 6, 6, generator=g, dtype=torch.float64)


def _bn_model() -> nn.Module:
    torch.manual_seed(1)
    return TwoBranchBN().to(torch.float64)


def _bn_reference() -> dict[str, Any]:
    """One process: step 1 (gradients accumulated over the micro-batches), an eval forward,
    step 2; the eval output and the final state (parameters and buffers)."""
    model = _bn_model()
    batches, probe = _bn_data()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    size = BATCH // MICRO_BATCHES
    evals = []
    for x, y in batches:
        model.train()
        opt.zero_grad(set_to_none=True)
        for m in range(MICRO_BATCHES):
            (F.cross_entropy(model(x[m * size:(m + 1) * size]), y[m * size:(m + 1) * size]) / MICRO_BATCHES).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            evals.append(model(probe))
    return {"evals": evals, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def _worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.errors import InputError

    out: dict[str, Any] = {}

    # BERT, dropout 0.1: eval outputs are the plain model's eval outputs; train() turns dropout on again
    model, inputs = _bert()
    model.eval()
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
    model.train()
    with graphpipe.wrap(model, inputs, lambda o, t: o.last_hidden_state.square().mean(), capture="export",
                        micro_batches=MICRO_BATCHES, timeout=120) as pipe:
        out["bert_stages"] = pipe.plan.num_stages
        pipe.eval()
        out["bert_eval"] = pipe.eval_forward(inputs).last_hidden_state
        out["bert_want"] = want
        pipe.train()
        torch.manual_seed(10 + rank)
        out["bert_train_a"] = pipe.eval_forward(inputs).last_hidden_state
        out["bert_train_b"] = pipe.eval_forward(inputs).last_hidden_state

    # batch norm: train, eval, train, eval on the pipeline as in one process; on the planner's
    # plan, and on a plan with two stages on rank 0 (the switch reaches every stage of a rank)
    batches, probe = _bn_data()
    graph = graphpipe.trace(_bn_model(), batches[0][0], capture="export")
    shared = graphpipe.plan(graph, WORLD, "manual", manual={"a": 0, "b": 1, "head": 2, "": 2},
                            stage_devices={0: [0], 1: [1], 2: [0]}, micro_batches=MICRO_BATCHES)
    for key, plan in (("bn", None), ("bn_shared", shared)):
        with graphpipe.wrap(_bn_model(), batches[0][0], F.cross_entropy, capture="export",
                            micro_batches=MICRO_BATCHES, plan=plan, timeout=120) as pipe:
            out[f"{key}_stages"] = pipe.plan.num_stages
            out[f"{key}_local_stages"] = len(pipe._local.stages)
            opt = torch.optim.SGD(pipe.parameters(), lr=LR)
            out[f"{key}_evals"] = []
            for x, y in batches:
                pipe.train()
                pipe.step(x, y, optimizer=opt)
                pipe.eval()
                out[f"{key}_evals"].append(pipe.eval_forward(probe))
            state = pipe.full_state_dict()
            if rank == 0:
                out[f"{key}_state"] = state

    # a Python branch on self.training: eval is refused, naming it; training is unaffected
    torch.manual_seed(2)
    with graphpipe.wrap(BranchesOnTraining(), torch.randn(BATCH, 6), F.cross_entropy, capture="export",
                        micro_batches=MICRO_BATCHES, timeout=120) as pipe:
        try:
            pipe.eval()
            out["branch_error"] = None
        except InputError as exc:
            out["branch_error"] = str(exc)
        pipe.train()
        out["branch_training"] = pipe.module.training

    # captured in eval mode: there is no training program to switch to
    torch.manual_seed(2)
    model = BranchesOnTraining().eval()
    with graphpipe.wrap(model, torch.randn(BATCH, 6), F.cross_entropy, capture="export",
                        micro_batches=MICRO_BATCHES, timeout=120) as pipe:
        pipe.eval()
        try:
            pipe.train()
            out["eval_capture_error"] = None
        except InputError as exc:
            out["eval_capture_error"] = str(exc)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    ranks = run_ranks(_worker, WORLD, timeout=300)
    for r in ranks:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return [r.value for r in ranks]


def test_exported_bert_eval_matches_the_plain_model(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["bert_stages"] >= WORLD  # pipelined over the ranks (the default may fold two on one)
        torch.testing.assert_close(out["bert_eval"], out["bert_want"], **TOLERANCE)
        # back in training mode, dropout draws masks again: two forwards differ, and differ from eval
        assert not torch.allclose(out["bert_train_a"], out["bert_train_b"])
        assert not torch.allclose(out["bert_train_a"], out["bert_want"])


def test_exported_batch_norm_trains_and_evaluates_like_one_process(results: list[dict[str, Any]]) -> None:
    ref = _bn_reference()
    assert results[0]["bn_shared_local_stages"] == 2 and results[1]["bn_shared_local_stages"] == 1
    for key in ("bn", "bn_shared"):
        for out in results:
            assert out[f"{key}_stages"] >= WORLD
            for got, want in zip(out[f"{key}_evals"], ref["evals"], strict=True):
                torch.testing.assert_close(got, want, **TOLERANCE, msg=lambda m, key=key: f"{key}: {m}")
        state = results[0][f"{key}_state"]
        assert list(state) == list(ref["state"])
        for k, v in state.items():
            torch.testing.assert_close(v, ref["state"][k], **TOLERANCE, msg=lambda m, k=k, key=key: f"{key} {k}: {m}")
        # the eval forwards counted no batch: 2 steps x 4 micro-batches
        assert int(state["a.1.num_batches_tracked"]) == 2 * MICRO_BATCHES


def test_branch_on_self_training_is_refused_by_eval(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["branch_error"] is not None and "self.training" in out["branch_error"], out["branch_error"]
        assert "model.eval() before graphpipe.wrap" in out["branch_error"]
        assert out["branch_training"] is True


def test_eval_capture_refuses_train(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["eval_capture_error"] is not None and "eval mode" in out["eval_capture_error"]
        assert "model.train() before graphpipe.wrap" in out["eval_capture_error"]
