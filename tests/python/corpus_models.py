"""The model corpus of the "real models" tests: torchvision classifiers nobody in this project
wrote, and small hand-written patterns that ordinary PyTorch code uses (in-place writes, buffers
read directly, tied weights, no_grad blocks, inputs with defaults).

Every entry builds, from fixed seeds, the model, its example inputs, a list of (inputs, targets)
batches and its loss, identically in every process that asks (the ranks are spawned processes).

The corpus trains in float64. Why: the CNNs run BatchNorm on micro-batches of two samples, and
at ResNet-18's last stage (1x1 spatial at 32x32 inputs) a channel's statistics come from two
numbers; that amplifies rounding so much that plain single-process training in float32 changes
conv1's gradient by 0.68 between one and two torch threads. In float64 the same difference is
below 1e-9, so a tight tolerance separates a bug from summation order.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 8
MICRO_BATCHES = 4


def torchvision_models() -> Any:
    """``torchvision.models``, importable beside a CPU build of torch.

    torchvision's wheels on PyPI are built against CUDA torch: with a CPU torch its compiled
    operators (nms, roi_align, ...) fail to load, and ``import torchvision`` then fails while
    registering their meta kernels ("operator torchvision::nms does not exist"). The model
    classes are pure Python and need none of those operators, so the package is entered without
    running its ``__init__`` (a bare package module over the installed folder); the submodules
    then import normally. With a torch that matches torchvision's build, plain import works and
    is used."""
    try:
        import torchvision.models as models

        return models
    except (ImportError, RuntimeError):
        pass
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("torchvision is not installed (pip install torchvision)")
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package of the failed attempt
    # A module made from the spec keeps __spec__ (and __path__), which transformers and timm
    # check with importlib.util.find_spec when they are imported later in the same process.
    sys.modules["torchvision"] = importlib.util.module_from_spec(spec)
    import torchvision.models as models

    return models


# ---- hand-written patterns ------------------------------------------------------------------


class InplaceAfterCut(nn.Module):
    """An in-place ReLU and an in-place add, each right after a tensor a cut can deliver."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(32, 32)
        self.skip = nn.Linear(16, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        y = self.fc2(h)
        y.add_(self.skip(x))          # written in place: a received y must be writable
        y = F.relu(y, inplace=True)
        return self.head(y)


class InplaceInput(nn.Module):
    """Writes into its input before using it, as preprocessing code does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.other = nn.Linear(16, 16)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = self.other(x * 3.0)   # reads x before the writes (saving a copy, not x)
        x.mul_(2)
        x[:, 0] = 0
        after = self.fc(x)             # reads the written x
        return self.head(torch.cat([before, after], dim=1))


class DirectBuffer(nn.Module):
    """Reads registered buffers in forward (not inside a submodule), one of them non-persistent."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)
        self.register_buffer("center", torch.linspace(-1, 1, 16))
        self.register_buffer("scale", torch.full((16,), 0.5), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.center.clone()
        h = torch.tanh(self.fc1(x - k)) * self.scale
        return self.fc2(h)


class TiedEmbedding(nn.Module):
    """A language-model shape whose output projection reuses the input embedding matrix."""

    def __init__(self, vocab: int = 20, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).mean(dim=1)
        return self.out(self.body(h))


class NoGradBlock(nn.Module):
    """The four ways to stop gradients: a frozen feature extractor under torch.no_grad(), a
    branch under torch.inference_mode() (cloned before use, as eager code must), a detached
    branch, and a parameter with requires_grad=False."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(16, 16)
        self.probe = nn.Linear(16, 16)
        self.aux = nn.Linear(16, 16)
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        self.head.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = torch.relu(self.frozen(x))
        with torch.inference_mode():
            probed = self.probe(x)
        side = self.aux(x).detach()
        h = torch.relu(self.fc(features)) + features + 0.1 * side + 0.1 * probed.clone()
        return self.head(h)


class DefaultInput(nn.Module):
    """Two inputs, the second with a default (None): used when given."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.ctx = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        if context is not None:
            h = h + self.ctx(context)
        return self.head(h)


# ---- the corpus -------------------------------------------------------------------------------


@dataclass
class Case:
    """One corpus model with its data, identical in every process."""

    model: nn.Module
    example: tuple
    batches: list[tuple[tuple, torch.Tensor]]
    loss_fn: Callable[[Any, Any], torch.Tensor]


def _images(model: nn.Module, size: int, classes: int, steps: int) -> Case:
    g = torch.Generator().manual_seed(7)
    batches = [
        ((torch.randn(BATCH, 3, size, size, generator=g),), torch.randint(0, classes, (BATCH,), generator=g))
        for _ in range(steps)
    ]
    return Case(model, batches[0][0], batches, F.cross_entropy)


def _vectors(model: nn.Module, steps: int, extra: Callable[[torch.Generator], tuple] | None = None) -> Case:
    g = torch.Generator().manual_seed(7)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, 16, generator=g)
        inputs = (x, *extra(g)) if extra else (x,)
        batches.append((inputs, torch.randint(0, 4, (BATCH,), generator=g)))
    return Case(model, tuple(t.clone() for t in batches[0][0]), batches, F.cross_entropy)


def build(name: str, steps: int = 2, dtype: torch.dtype = torch.float64) -> Case:
    """The corpus entry ``name`` (see ``NAMES``), seeded, its model and float data in ``dtype``.
    Dropout is switched off (p=0): each rank draws its own random masks, so a pipeline cannot
    reproduce one process's masks."""
    case = _build(name, steps)
    case.model.to(dtype)
    for module in case.model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0

    def cast(inputs: tuple) -> tuple:
        return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)

    case.example = cast(case.example)
    case.batches = [(cast(inputs), targets) for inputs, targets in case.batches]
    return case


def _build(name: str, steps: int) -> Case:
    torch.manual_seed(0)
    if name == "resnet18":
        return _images(torchvision_models().resnet18(num_classes=10), 32, 10, steps)
    if name == "googlenet":
        tv = torchvision_models()
        return _images(tv.googlenet(num_classes=10, aux_logits=False, init_weights=True), 32, 10, steps)
    if name == "squeezenet":
        return _images(torchvision_models().squeezenet1_1(num_classes=10), 48, 10, steps)
    if name == "default_input":
        return _vectors(DefaultInput(), steps, lambda g: (torch.randn(BATCH, 8, generator=g),))
    if name == "tied_embedding":
        model = TiedEmbedding()
        g = torch.Generator().manual_seed(7)
        batches = [
            ((torch.randint(0, 20, (BATCH, 5), generator=g),), torch.randint(0, 20, (BATCH,), generator=g))
            for _ in range(steps)
        ]
        return Case(model, batches[0][0], batches, F.cross_entropy)
    patterns = {
        "inplace_after_cut": InplaceAfterCut,
        "inplace_input": InplaceInput,
        "direct_buffer": DirectBuffer,
        "no_grad_block": NoGradBlock,
    }
    if name in patterns:
        return _vectors(patterns[name](), steps)
    raise KeyError(f"no corpus model {name!r}; known: {NAMES}")


#: The hand-written patterns (small: cheap enough to run under every schedule in CI).
PATTERNS = ["inplace_after_cut", "inplace_input", "direct_buffer", "tied_embedding", "no_grad_block", "default_input"]
NAMES = ["resnet18", "googlenet", "squeezenet", *PATTERNS]


def reference(name: str, steps: int = 2, lr: float = 0.05, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """Single-process training on the corpus entry: per step, the gradients of the micro-batches
    accumulated in order (each micro-batch's loss scaled by 1/MICRO_BATCHES, as the pipeline
    does; BatchNorm sees the same micro-batches), then one SGD step. Returns the per-step losses,
    the final state dict and the parameters' .grad of the last step (None where there is none)."""
    case = build(name, steps, dtype)
    model = case.model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in case.batches:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=dtype)
        for m in range(MICRO_BATCHES):
            sl = slice(m * BATCH // MICRO_BATCHES, (m + 1) * BATCH // MICRO_BATCHES)
            mb = tuple(t[sl].clone() for t in inputs)
            loss = case.loss_fn(model(*mb), targets[sl]) / MICRO_BATCHES
            loss.backward()
            total = total + loss.detach()
        opt.step()
        losses.append(total)
    return {
        "losses": torch.stack(losses),
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "grads": {k: (None if p.grad is None else p.grad.clone()) for k, p in model.named_parameters()},
    }
