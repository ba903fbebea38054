"""A pipeline's state dicts under the plain model's names: this rank's shard, and the check that
decides whether a given state dict can be loaded (``Pipeline.state_dict`` / ``load_state_dict``;
folder checkpoints are checkpoint.py's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from graphpipe.capture import ModeSwitch

__all__ = ["ModelFacts", "load_refusal", "stage_state_dict", "state_aliases"]


@dataclass(frozen=True)
class ModelFacts:
    """What a pipeline keeps of the plain model it wrapped, once its stage is cut: the model's
    class ``name``, its ``state_dict`` keys in order and the aliases among them (the names every
    state dict and checkpoint is written under), and what switching its stage between training
    and eval takes (``modes``: the capture front end's ``ModeSwitch``, graphpipe/capture.py)."""

    name: str
    state_keys: tuple[str, ...]
    aliases: Mapping[str, tuple[str, ...]]
    modes: ModeSwitch = field(default_factory=ModeSwitch)

    @classmethod
    def of(cls, model: nn.Module, traced: Any) -> ModelFacts:
        return cls(type(model).__name__, tuple(model.state_dict().keys()), state_aliases(model), traced.modes)

    def state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The entries of the plain model's state dict that the stage ``module`` holds."""
        return stage_state_dict(module, list(self.state_keys), self.aliases)


def state_aliases(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """For every state-dict name of a tensor the model registers under several names, the other
    names (parameters and buffers, found by identity as ``named_parameters(remove_duplicate=False)``
    lists them)."""
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    return {n: tuple(m for m in group if m != n) for group in names.values() if len(group) > 1 for n in group}


def stage_state_dict(module: nn.Module, model_keys: list[str],
                     aliases: Mapping[str, tuple[str, ...]]) -> dict[str, torch.Tensor]:
    """The entries of the plain model's ``state_dict`` (keys ``model_keys``) that the stage
    ``module`` holds, in the model's order."""
    wanted = set(model_keys)
    own = {k: v for k, v in module.state_dict().items() if k in wanted}
    # A tensor the model registers under several names (``self.p1 = self.p0``, a module
    # assigned to two attributes) has one name in the stage module: the others are added.
    for name in list(own):
        for alias in aliases.get(name, ()):
            own.setdefault(alias, own[name])
    return {k: own[k] for k in model_keys if k in own}


def load_refusal(own: Mapping[str, torch.Tensor], state: Mapping[str, Any], strict: bool, rank: int) -> str | None:
    """Why ``state`` cannot be loaded into a stage holding ``own`` (None: it can)."""
    missing = [k for k in own if k not in state]
    if strict and missing:
        return (f"the state dict lacks {len(missing)} entries of rank {rank}'s stage, e.g. {missing[:3]}; pass this "
                "rank's shard (state_dict()) or the full state dict")
    for k, mine in own.items():
        if k not in state:
            continue
        given = state[k]
        if not isinstance(given, torch.Tensor):
            return f"entry {k!r} for rank {rank} is a {type(given).__name__}, not a tensor"
        if given.shape != mine.shape:
            return f"entry {k!r} for rank {rank} has shape {tuple(given.shape)}, the model's has {tuple(mine.shape)}"
        if not torch.can_cast(given.dtype, mine.dtype):
            return (f"entry {k!r} for rank {rank} has dtype {given.dtype}, which does not cast to the model's "
                    f"{mine.dtype}")
    return None
