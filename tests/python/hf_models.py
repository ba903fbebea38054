"""Tiny Hugging Face ``transformers`` models for the torch.export capture tests: CLIP (two towers,
contrastive loss), GPT-2 (embedding tied to the LM head) and LLaVA (CLIP vision tower, projector,
Llama decoder), built from small configs and fixed seeds, never from downloaded weights.

Every entry builds, identically in every process that asks, the model (float64, dropout off, no
KV cache, as training uses), a list of (keyword inputs, targets) batches and its loss. float64
for the same reason as the model corpus (``corpus_models``): a tight tolerance then separates a
bug from summation order. Dropout is off because the pipeline's ranks draw their own masks.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything

BATCH = 8
MICRO_BATCHES = 4
NAMES = ["clip", "gpt2", "llava"]


def import_transformers() -> Any:
    """``transformers``, importable beside a CPU build of torch.

    transformers imports ``torchvision.transforms`` when torchvision is installed; torchvision's
    PyPI wheels are built against CUDA torch, and with a CPU torch its ``__init__`` fails loading
    its compiled operators (which no model here needs). The package is then entered without its
    ``__init__``: a module made from its import spec keeps ``__spec__``, which transformers
    checks, and its submodules import normally."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the half-imported package of the failed attempt
        spec = importlib.util.find_spec("torchvision")
        if spec is not None:
            sys.modules["torchvision"] = importlib.util.module_from_spec(spec)
    import transformers

    return transformers


@dataclass
class Case:
    model: nn.Module
    example: dict[str, torch.Tensor]
    batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]]
    loss_fn: Callable[[Any, Any], torch.Tensor]


def clip_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """CLIP's symmetric contrastive loss over the (micro-)batch: image i goes with text i."""
    labels = torch.arange(output.logits_per_image.shape[0])
    return (F.cross_entropy(output.logits_per_image, labels) + F.cross_entropy(output.logits_per_text, labels)) / 2


def lm_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of a causal LM's logits (targets are the shifted tokens)."""
    return F.cross_entropy(output.logits.flatten(0, 1), targets.flatten())


def clip_config(hidden: int = 16, layers: int = 2, image: int = 16, positions: int = 16) -> Any:
    tf = import_transformers()
    return tf.CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, max_position_embeddings=positions, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=2, image_size=image, patch_size=8),
        projection_dim=8,
    )


def _clip(steps: int) -> Case:
    tf = import_transformers()
    torch.manual_seed(0)
    model = tf.CLIPModel(clip_config()).to(torch.float64)
    g = torch.Generator().manual_seed(7)

    def batch() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return ({"input_ids": torch.randint(2, 64, (BATCH, 7), generator=g),
                 "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g, dtype=torch.float64)},
                torch.arange(BATCH))

    batches = [batch() for _ in range(steps)]
    return Case(model, batches[0][0], batches, clip_loss)


def _gpt2(steps: int) -> Case:
    tf = import_transformers()
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, tie_word_embeddings=True)
    model = tf.GPT2LMHeadModel(config).to(torch.float64)
    assert model.lm_head.weight is model.transformer.wte.weight
    g = torch.Generator().manual_seed(7)
    batches = []
    for _ in range(steps):
        tokens = torch.randint(0, 64, (BATCH, 9), generator=g)
        batches.append(({"input_ids": tokens[:, :-1]}, tokens[:, 1:]))
    return Case(model, batches[0][0], batches, lm_loss)


def _llava(steps: int) -> Case:
    tf = import_transformers()
    torch.manual_seed(0)
    vision = tf.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 image_size=16, patch_size=8)
    text = tf.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=63,
                            vision_feature_select_strategy="default", vision_feature_layer=-1)
    config.use_cache = False
    model = tf.LlavaForConditionalGeneration(config).to(torch.float64)
    g = torch.Generator().manual_seed(7)
    image_tokens = (16 // 8) ** 2  # patches; the CLS feature is dropped ("default")
    batches = []
    for _ in range(steps):
        words = torch.randint(3, 60, (BATCH, 6), generator=g)
        ids = torch.cat([words[:, :1], torch.full((BATCH, image_tokens), 63), words[:, 1:]], dim=1)
        inputs = {"input_ids": ids[:, :-1],
                  "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g, dtype=torch.float64)}
        batches.append((inputs, ids[:, 1:]))
    # LLaVA's code loops over the images of a batch, so torch.export fixes the batch size; the
    # example is still the step's whole batch: wrap captures the model again on its first rows,
    # one micro-batch, the size every micro-batch of the pipeline has.
    return Case(model, batches[0][0], batches, lm_loss)


_BUILDERS = {"clip": _clip, "gpt2": _gpt2, "llava": _llava}


def build(name: str, steps: int = 2) -> Case:
    return _BUILDERS[name](steps)


def reference(name: str, steps: int = 2, lr: float = 0.05) -> dict[str, Any]:
    """Single-process training: per step, the gradients of the micro-batches accumulated in
    order (each micro-batch's loss scaled by 1/MICRO_BATCHES, as the pipeline does), then one
    SGD step. The per-step losses and the final state dict."""
    case = build(name, steps)
    model = case.model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    size = BATCH // MICRO_BATCHES
    for inputs, targets in case.batches:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64)
        for m in range(MICRO_BATCHES):
            mb = {k: v[m * size:(m + 1) * size] for k, v in inputs.items()}
            loss = case.loss_fn(model(**mb), targets[m * size:(m + 1) * size]) / MICRO_BATCHES
            loss.backward()
            total = total + loss.detach()
        opt.step()
        losses.append(total)
    return {"losses": torch.stack(losses), "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
