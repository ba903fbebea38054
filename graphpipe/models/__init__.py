"""Benchmark models for graph pipeline parallelism (MMT, DLRM, CANDLE-Uno, sequential Transformer)."""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .candle_uno import CandleUno, CandleUnoConfig
from .dlrm import DLRM, DLRMConfig
from .layers import MLP, TransformerBlock
from .mmt import MMTConfig, MultiModalTransformer
from .transformer import SequentialTransformer, TransformerConfig

__all__ = [
    "DEFAULT_BATCH",
    "MODELS",
    "MLP",
    "CandleUno",
    "CandleUnoConfig",
    "DLRM",
    "DLRMConfig",
    "MMTConfig",
    "ModelSpec",
    "MultiModalTransformer",
    "SequentialTransformer",
    "TransformerBlock",
    "TransformerConfig",
    "build_model",
    "default_loss",
    "parse_spec",
]

#: Registry: spec name -> model class (each has ``small``/``paper`` classmethods,
#: ``config``, ``example_inputs`` and ``example_targets``).
MODELS: dict[str, type[nn.Module]] = {
    "mmt": MultiModalTransformer,
    "dlrm": DLRM,
    "candle_uno": CandleUno,
    "transformer": SequentialTransformer,
}

_CONFIGS: dict[str, type] = {
    "mmt": MMTConfig,
    "dlrm": DLRMConfig,
    "candle_uno": CandleUnoConfig,
    "transformer": TransformerConfig,
}

_LOSSES: dict[str, Callable[[], nn.Module]] = {
    "mmt": nn.CrossEntropyLoss,
    "dlrm": nn.MSELoss,
    "candle_uno": nn.MSELoss,
    "transformer": nn.CrossEntropyLoss,
}

#: Batch size used by :func:`build_model` when the spec has no ``batch`` key.
DEFAULT_BATCH = 8

_SIZES = ("small", "paper")
# Keys accepted by every model in addition to its config fields.
_RESERVED_KEYS = ("batch", "device", "seed", "size")


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec (see :func:`parse_spec`)."""

    name: str
    size: str = "small"
    batch: int = DEFAULT_BATCH
    device: torch.device | None = None
    seed: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


def _check_name(name: str) -> str:
    key = name.strip().lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(sorted(MODELS))}")
    return key


def _valid_keys(name: str) -> list[str]:
    return sorted([f.name for f in dataclasses.fields(_CONFIGS[name])] + list(_RESERVED_KEYS))


def _parse_int(key: str, text: str, minimum: int | None = None) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"key {key!r} expects an int, got {text!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"key {key!r} must be >= {minimum}, got {value}")
    return value


def _parse_value(key: str, text: str, typ: Any) -> Any:
    if typ is int:
        return _parse_int(key, text)
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"key {key!r} expects a float, got {text!r}") from None
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"key {key!r} expects a bool, got {text!r}")
    if typ is str:
        return text
    raise ValueError(f"key {key!r} has unsupported type {typ!r}")  # pragma: no cover


def parse_spec(spec: str) -> ModelSpec:
    """Parse a model spec string into a :class:`ModelSpec`.

    Grammar (whitespace around tokens is ignored, the name is case-insensitive)::

        spec  := NAME [ ":" [ item ( "," item )* ] ]
        item  := KEY "=" VALUE

    ``NAME`` is a key of :data:`MODELS`.  ``KEY`` is a field of the model's
    config dataclass (int-valued, overriding the chosen size) or one of:

    * ``size``: ``small`` (default) or ``paper``;
    * ``batch``: positive int, batch size of the example inputs (default 8);
    * ``device``: a ``torch.device`` string, e.g. ``meta`` (construct without
      allocating memory), ``cpu``, ``cuda:0``; default: the current default device;
    * ``seed``: int; if given, ``torch.manual_seed(seed)`` is called before
      construction and the example inputs use a generator seeded with it.

    Unknown model names, unknown or repeated keys, malformed items and
    ill-typed values raise ``ValueError`` (naming the bad key and listing the
    valid ones where applicable).
    """
    if not isinstance(spec, str):
        raise ValueError(f"model spec must be a str, got {type(spec).__name__}")
    name_part, sep, rest = spec.partition(":")
    name = _check_name(name_part)
    valid = _valid_keys(name)
    hints = typing.get_type_hints(_CONFIGS[name])

    size = "small"
    batch = DEFAULT_BATCH
    device: torch.device | None = None
    seed: int | None = None
    overrides: dict[str, Any] = {}
    seen: set[str] = set()

    items = rest.split(",") if sep and rest.strip() else []
    for item in items:
        key, eq, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not eq or not key or not text:
            raise ValueError(
                f"malformed item {item.strip()!r} in model spec {spec!r}; expected key=value "
                f"with key one of: {', '.join(valid)}"
            )
        if key not in valid:
            raise ValueError(
                f"unknown key {key!r} for model {name!r}; valid keys: {', '.join(valid)}"
            )
        if key in seen:
            raise ValueError(f"key {key!r} given more than once in model spec {spec!r}")
        seen.add(key)
        if key == "size":
            if text.lower() not in _SIZES:
                raise ValueError(f"key 'size' must be one of {', '.join(_SIZES)}, got {text!r}")
            size = text.lower()
        elif key == "batch":
            batch = _parse_int(key, text, minimum=1)
        elif key == "seed":
            seed = _parse_int(key, text)
        elif key == "device":
            try:
                device = torch.device(text)
            except (RuntimeError, ValueError):
                raise ValueError(f"key 'device' expects a torch device, got {text!r}") from None
        else:
            overrides[key] = _parse_value(key, text, hints[key])
    return ModelSpec(name=name, size=size, batch=batch, device=device, seed=seed, overrides=overrides)


def build_model(spec: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Build a model and example inputs from a spec string (grammar: :func:`parse_spec`).

    Examples: ``"mmt"``, ``"mmt:branches=4,depth=2,hidden=64"``, ``"dlrm:size=paper"``,
    ``"candle_uno:branches=16"``, ``"transformer:batch=2"``, ``"dlrm:size=paper,device=meta"``.

    Returns ``(model, inputs)`` where ``model(*inputs)`` is a valid call and
    ``inputs = model.example_inputs(batch)``.  With ``device=meta`` the model
    and inputs are built on the meta device (no memory is allocated).
    """
    ps = parse_spec(spec)
    cls = MODELS[ps.name]
    config_cls: Any = _CONFIGS[ps.name]
    config = config_cls.paper(**ps.overrides) if ps.size == "paper" else config_cls.small(**ps.overrides)
    generator: torch.Generator | None = None
    if ps.seed is not None:
        torch.manual_seed(ps.seed)
        generator = torch.Generator().manual_seed(ps.seed)
    ctx = ps.device if ps.device is not None else contextlib.nullcontext()
    with ctx:
        model = cls(config)
    inputs = model.example_inputs(ps.batch, generator=generator)  # type: ignore[operator]
    return model, inputs


def default_loss(model_name: str) -> nn.Module:
    """Suggested loss for a model (name or spec): ``CrossEntropyLoss`` for ``mmt``/``transformer``,
    ``MSELoss`` for ``dlrm``/``candle_uno``.  Use with ``model.example_targets(batch)``."""
    return _LOSSES[_check_name(model_name.partition(":")[0])]()
