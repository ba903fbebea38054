"""Checkpoints with torch.distributed.checkpoint (DCP): ``Pipeline.save`` / ``Pipeline.load``, and
the plain model's side, :func:`load_into_model` and :func:`model_state_dict`.

One checkpoint is a DCP folder whose state dict has four parts, all under the plain model's
names (fully qualified names), so that it loads under any plan, any world size, or into the
plain single-process model:

- ``model.<fqn>``: every parameter and buffer, written once: by the first rank (the lead replica)
  of the stage that holds it (DCP drops the duplicates of a tensor tied across stages);
- ``optim.state.<fqn>.<name>``, ``optim.param_groups.<fqn>.<hyperparameter>``: the optimizer's
  state in torch's flat FQN-keyed form (``get_optimizer_state_dict`` with
  ``StateDictOptions(flatten_optimizer_state_dict=True)``, the form torch made for pipeline
  stages, whose ranks each hold other parameters), also by the lead replica;
- ``sync.rank<r>``: what is private to rank r, as one pickled blob: its sync method's state
  (``Pipeline.sync_state_dict``: local SGD's round, top-k's residuals, PowerSGD's state), and on a
  replicated stage its own buffers (a replica's BatchNorm statistics see only its rows), plus,
  for local methods (LocalSGD, QSR), its own parameters and optimizer state (replicas differ
  inside a round). Restored only under the same plan and sync method; otherwise ``load`` warns
  and those start afresh from the shared copy;
- ``graphpipe``: one pickled blob written by rank 0: format, the model's keys, plan fingerprint,
  sync method, optimizer class, ``step_count`` and the caller's ``extra``.

Loading is all-or-nothing on every rank. Each rank checks the checkpoint's metadata against what
it holds, the ranks agree (``Link.agree``) before any enters DCP's collective load, each
loads into fresh tensors (never into its module or optimizer), checks what it read, and the ranks
agree again; only then does any rank copy into its parameters, optimizer and sync state. A
checkpoint of another model, a missing folder or shard, or a truncated file is an ``InputError``
on every rank, and no rank changed anything. Every wait is a collective on the pipeline's own
process group, which has the pipeline's timeout.

Saving is atomic and checksummed, and fails together: every rank writes into a staging folder
beside ``path`` (checkpoint_folders.py), each entry's digest goes into the manifest rank 0 writes
last (checksums.py), and only then does rank 0 put the staging folder in place of ``path``.
Three exchanges of verdicts (before, after DCP's write, after the replacement) make a rank's
write error every rank's ``CheckpointError``, with every rank alive and the pipeline usable; a
collective that fails (a peer died or hangs), DCP's own included, fails the pipeline
(``Link.collective``, the one way every collective part fails together). ``load`` verifies
every entry it read against the manifest before anything is applied.

What is torch's: the file format, writer, reader and their collectives (``dcp.save``,
``dcp.load``, ``FileSystemWriter/Reader``), the deduplication of replicated tensors, and the
FQN-keyed optimizer state (``get_optimizer_state_dict``). What is written here: which rank writes
what, the per-rank sync blobs, the checks and the two agreements, and the conversion of the flat
optimizer state back into ``optimizer.load_state_dict``'s form (torch's
``set_optimizer_state_dict`` first primes a fresh optimizer with a zero-gradient step, which it
skips when any gradient is set, and expects state for every parameter; a stage whose optimizer
never stepped some parameter, or a checkpoint saved before the first step, would break it).
"""

from __future__ import annotations

import io
import os
import shutil
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from graphpipe.errors import CheckpointError, InputError
from graphpipe.runtime import checksums, consensus
from graphpipe.runtime.checkpoint_folders import new_save_id, recover, remove_leftovers, replace, staging_folder
from graphpipe.runtime.connections import Link
from graphpipe.runtime.failure import describe
from graphpipe.runtime.faults import Injector
from graphpipe.runtime.plan import plan_fingerprint
from graphpipe.runtime.process_group import Ranks
from graphpipe.runtime.stages import NO_PARAMETERS, LocalStage
from graphpipe.runtime.state_dicts import ModelFacts
from graphpipe.sync import SyncMethod

__all__ = ["Parts", "save", "load", "load_into_model", "model_state_dict", "FORMAT"]

#: Version of the layout above, stored in every checkpoint (2: with checksums, saved atomically).
FORMAT = 2
_META = "graphpipe"
_MODEL = "model."
_OPTIM = "optim."
_SYNC = "sync."


@dataclass(frozen=True)
class Parts:
    """What a checkpoint writes and restores of one rank of a pipeline, and what it runs on: the
    pipeline's ``link`` (its group, and failing together), this rank's stage (``local``) and the
    model's names (``facts``), where the rank sits (``ranks``), the plan and graph (the
    fingerprint), the sync method, the fault injector, and the steps done (``step_count``).
    ``Pipeline.save`` and ``Pipeline.load`` make one per call."""

    link: Link
    local: LocalStage
    facts: ModelFacts
    ranks: Ranks
    plan: Any
    graph: Any
    sync_method: SyncMethod
    faults: Injector
    step_count: int

    @property
    def module(self) -> nn.Module:
        return self.local.module

    @property
    def rank(self) -> int:
        return self.ranks.rank

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shard under the plain model's names."""
        return self.facts.state_dict(self.local.module)

    def is_lead(self) -> bool:
        """Whether this rank writes its stage's shared state: the stage's first rank."""
        ranks = self.local.ranks
        return bool(ranks) and ranks[0] == self.ranks.rank

    def fingerprint(self) -> str:
        """The plan's digest (runtime/plan.py)."""
        return plan_fingerprint(self.plan, self.graph)


# ---- saving ---------------------------------------------------------------------------------
def save(parts: Parts, path: str | os.PathLike, optimizer: torch.optim.Optimizer | None = None,
         extra: Mapping[str, Any] | None = None) -> None:
    """Collective over the pipeline's ranks: writes a DCP checkpoint of every rank's ``parts``
    (and ``optimizer``, over the stage's parameters) to the folder ``path``. ``extra``
    (picklable, for example a scheduler's state) is written from rank 0 and returned by
    :func:`load`.

    Atomic: the ranks write beside ``path`` and rank 0 replaces ``path`` only once everything is
    written and flushed (checkpoint_folders.py), so a save that fails or is killed at any point
    leaves ``path`` as it was. Fails together: a rank that cannot write makes every rank raise
    ``CheckpointError`` naming it (the pipeline stays usable); a peer that dies or hangs makes
    every rank raise ``PeerError`` or ``PipelineTimeout`` and fails the pipeline."""
    link = parts.link
    link.group()  # refuses a closed or failed pipeline
    path = os.path.abspath(os.fspath(path))
    where = f"Pipeline.save({path!r})"
    lead = parts.rank == 0
    state: dict[str, Any] = {}
    entries: dict[str, str] = {}
    refusal: str | None = None
    try:
        parts.faults.fire("save", parts.step_count)  # GRAPHPIPE_FAULT's save phase (failure tests)
        state = _state_to_save(parts, optimizer, extra)
        entries = checksums.digests(state)
    except Exception as exc:
        refusal = f"{describe(exc)} (preparing this rank's part)"
    proposal = new_save_id() if lead else None
    everyone = link.gather((refusal, entries, proposal), f"starting {where}")
    _refuse_together(where, [v[0] for v in everyone])
    save_id = everyone[0][2]
    merged, refusal = _merged_digests([v[1] for v in everyone])
    staged = staging_folder(path, save_id)
    if refusal is None and lead:
        refusal = _attempt(lambda: _prepare_folder(path, staged))
    _refuse_together(where, link.gather(refusal, where))
    # DCP's collectives (its planning and its write) are one collective part: a rank's own write
    # error is a refusal, any other failure in them fails the pipeline.
    with link.collective(f"writing {where}"), link.waiting(f"writing {where}"):
        try:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(staged, sync_files=True), process_group=link.group())
            refusal = None
        except CheckpointException as exc:
            refusal = _write_failure(exc)
    _refuse_together(where, link.gather(refusal, where), cleanup=_Cleanup(link, staged, lead))
    if lead:
        refusal = _attempt(lambda: _publish(path, staged, save_id, merged))
    _refuse_together(where, link.gather(refusal, where), cleanup=_Cleanup(link, staged, lead))


def _state_to_save(parts: Parts, optimizer: Any, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """This rank's part of the checkpoint, as DCP's state dict (see the module docstring)."""
    state: dict[str, Any] = {}
    own = parts.state_dict()
    if parts.is_lead():
        # A replicated stage's replicas hold the same parameters (or, for local methods, the
        # same ones at a round's end): one copy, the lead's, is what other plans load.
        state["model"] = {k: v.detach() for k, v in own.items()}
        if optimizer is not None:
            state["optim"] = _flat_optimizer_state(parts.module, optimizer)
    private = _private_state(parts, optimizer, own)
    if private is not None:
        state["sync"] = {f"rank{parts.rank}": _pickle(private)}
    if parts.rank == 0:
        state[_META] = _pickle({
            "format": FORMAT,
            "model_keys": list(parts.facts.state_keys),
            "plan": parts.fingerprint(),
            "world_size": parts.ranks.world_size,
            "sync_method": repr(parts.sync_method),
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "step_count": int(parts.step_count),
            "extra": dict(extra) if extra is not None else {},
        })
    return state


def _merged_digests(per_rank: list[dict[str, str]]) -> tuple[dict[str, str], str | None]:
    """Every rank's digests in one table. An entry two ranks write (a parameter tied across
    stages, which DCP writes once) must have the same digest on both."""
    merged: dict[str, str] = {}
    for rank, entries in enumerate(per_rank):
        for key, value in entries.items():
            if merged.setdefault(key, value) != value:
                return merged, (f"the entry {key!r} differs between rank {rank} and a rank before it (a tied "
                                "parameter whose copies are not equal)")
    return merged, None


def _prepare_folder(path: str, staged: str) -> None:
    """Rank 0, before the ranks write: the staging folder exists, the leftovers of dead saves
    are gone, and ``path``, if it exists, is a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{path} exists and is not a folder")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    remove_leftovers(path, keep=staged)
    os.makedirs(staged, exist_ok=False)


def _publish(path: str, staged: str, save_id: str, entries: Mapping[str, str]) -> None:
    """Rank 0, after every rank's shards and DCP's metadata are written: the manifest, then the
    staged checkpoint in place of ``path``."""
    checksums.Manifest.of_folder(staged, entries).write(staged)
    replace(path, staged, save_id)


def _attempt(body: Callable[[], None]) -> str | None:
    """Runs ``body``; its error as a refusal (None when it succeeded)."""
    try:
        body()
    except Exception as exc:
        return describe(exc)
    return None


def _first_failure(exc: CheckpointException) -> tuple[int, BaseException] | None:
    """The lowest rank DCP reports a failure of, and that failure (every rank gets the same
    exception); None when it names none."""
    if not exc.failures:
        return None
    rank, cause = sorted(exc.failures.items())[0]
    return rank, cause[0] if isinstance(cause, tuple) else cause


def _write_failure(exc: CheckpointException) -> str:
    """The first rank's cause of a DCP write that failed."""
    first = _first_failure(exc)
    if first is not None:
        return f"writing failed on rank {first[0]} ({describe(first[1])})"
    return f"writing failed ({describe(exc)})"


@dataclass(frozen=True)
class _Cleanup:
    """The staged folder a refused save leaves: rank 0 (``lead``) removes it, and every rank
    waits for that over ``link`` before raising, so no rank sees the folder after its error."""
    link: Link
    staged: str
    lead: bool

    def run(self, where: str) -> None:
        if self.lead:
            shutil.rmtree(self.staged, ignore_errors=True)
        self.link.gather(None, f"cleaning up after {where}")


def _refuse_together(where: str, verdicts: list[str | None], cleanup: _Cleanup | None = None) -> None:
    """Raises the same CheckpointError on every rank when some rank refused (every rank's
    verdict, None: it succeeded; the pipeline stays usable: every rank is alive and in step),
    after ``cleanup`` removed the staged folder."""
    refused = consensus.refusals(verdicts)
    if refused is None:
        return
    if cleanup is not None:
        cleanup.run(where)
    raise CheckpointError(f"{where} failed {refused}; the checkpoint at the path, if any, is unchanged and the "
                          "pipeline can go on training")


def _private_state(parts: Parts, optimizer: Any, own: Mapping[str, torch.Tensor]) -> dict[str, Any] | None:
    """This rank's own part: sync state, and on a replicated stage the state its replicas do not
    share. None when it has nothing of its own."""
    sync = parts.link.sync_state()
    replicated = parts.local.replicated
    if not sync and not replicated:
        return None
    private: dict[str, Any] = {"sync": sync}
    if replicated:
        params = {n for n, _ in parts.module.named_parameters()}
        local = bool(getattr(parts.sync_method, "local_updates", False))
        # Buffers always (each replica's statistics are of its own rows); parameters and the
        # optimizer only for local methods, whose replicas drift apart inside a round.
        private["state"] = {k: v.detach().clone() for k, v in own.items() if local or k not in params}
        if local and optimizer is not None:
            private["optim"] = _flat_optimizer_state(parts.module, optimizer)
    return private


def _flat_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by the parameters' FQNs, in torch's flat form."""
    if not optimizer.state:
        # torch's get_optimizer_state_dict would first take a zero-gradient step to create the
        # state, which changes an Adam's step count: before the first step, only the
        # hyperparameters (the same flat keys torch writes).
        names = {id(p): n for n, p in module.named_parameters()}
        flat: dict[str, Any] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                for k, v in group.items():
                    if k != "params":
                        flat[f"param_groups.{names[id(p)]}.{k}"] = v
        return flat
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    return dict(get_optimizer_state_dict(module, optimizer, options=options))


def _pickle(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _unpickle(blob: Any, what: str) -> Any:
    if not isinstance(blob, (bytes, bytearray)):
        raise InputError(f"{what} is {type(blob).__name__}, not graphpipe's pickled record")
    # Our own records (and the caller's extra), written by save(): not weights only.
    return torch.load(io.BytesIO(blob), weights_only=False)


# ---- loading --------------------------------------------------------------------------------
def load(parts: Parts, path: str | os.PathLike, optimizer: torch.optim.Optimizer | None = None
         ) -> tuple[dict[str, Any], int]:
    """Collective over the pipeline's ranks: restores a checkpoint written by :func:`save`, under
    this plan or another, into every rank's stage (and ``optimizer``), or raises the same
    ``InputError`` on every rank and changes nothing. Every entry read is checked against its
    checksum before anything is applied. Returns the ``extra`` it was saved with, and its step
    count."""
    link, rank = parts.link, parts.rank
    link.group()  # refuses a closed or failed pipeline
    path = os.path.abspath(os.fspath(path))
    where = f"Pipeline.load({path!r})"
    own = parts.state_dict()
    template: dict[str, Any] | None = None
    refusal: str | None = None
    try:
        parts.faults.fire("load", parts.step_count)  # GRAPHPIPE_FAULT's load phase (failure tests)
        metadata, manifest = _read_metadata(path)
        template = _template(metadata, own, parts.module, optimizer, model_keys=list(parts.facts.state_keys))
        private_key = f"{_SYNC}rank{rank}"
        if private_key in metadata.state_dict_metadata:
            template.setdefault("sync", {})[f"rank{rank}"] = None
    except InputError as exc:
        refusal = str(exc)
    except Exception as exc:
        refusal = f"{describe(exc)} (on rank {rank})"
    # No rank may enter DCP's collective load alone: all of them, or none.
    link.agree(where, refusal)
    assert template is not None
    # DCP's collective read is one collective part: a rank's own reading error (DCP reports it
    # as CheckpointException on every rank) is a refusal, anything else is its collectives
    # failing (a peer died or hangs), which fails the pipeline.
    unread: str | None = None
    with link.collective(f"reading {where}"), link.waiting(f"reading {where}"):
        try:
            dcp.load(template, storage_reader=dcp.FileSystemReader(path), process_group=link.group())
        except CheckpointException as exc:
            unread = _reason(exc, path, _damaged_entry(template, path, metadata))
    loaded: dict[str, Any] = {}
    private: Mapping[str, Any] | None = None
    restore_private = False
    try:
        if unread is not None:
            raise InputError(unread)
        _verify(manifest, metadata, template, path)
        loaded = _checked(template, own, parts.module, optimizer)
        private = _unpickle(template["sync"][f"rank{rank}"], "this rank's sync record") \
            if "sync" in template else None
        restore_private = _same_run(parts, loaded["meta"], private)
        refusal = None
    except InputError as exc:
        refusal = f"{exc} (found by rank {rank})"
    except Exception as exc:
        refusal = _reason(exc, path)
    link.agree(where, refusal)
    # Every rank read and checked everything: apply.
    state, optim = loaded["model"], loaded["optim"]
    if restore_private and private is not None:
        state = {**state, **private.get("state", {})}
        if "optim" in private:
            optim = private["optim"]
    _copy_into(own, state)
    if optimizer is not None and optim is not None:
        _load_flat_optimizer_state(parts.module, optimizer, optim)
    if restore_private:
        # Collective (it agrees over the pipeline's group): every rank takes part, those with no
        # record of their own (no replicated stage, or no stage) with an empty state. Before,
        # only the ranks with a record called it, and they waited for the others until the
        # timeout, on any plan that replicates some stages and not others.
        link.load_sync_state(private["sync"] if private is not None else {}, "Pipeline.load_sync_state_dict")
    return dict(loaded["meta"]["extra"]), int(loaded["meta"]["step_count"])


def _verify(manifest: checksums.Manifest, metadata: Metadata, template: Mapping[str, Any], path: str) -> None:
    """Every entry DCP read into ``template`` has its saved checksum; InputError naming the first
    that does not, and its file."""
    bad = manifest.mismatch(template)
    if bad is not None:
        key, saved, read = bad
        raise InputError(f"the checkpoint's entry {key!r} (in {_file_of(metadata, key, path)}) is damaged: its "
                         f"checksum is {read}, the saved one {saved}")


def _file_of(metadata: Metadata, key: str, path: str) -> str:
    """The file of ``path`` that holds the entry ``key`` (DCP's storage index)."""
    for index, info in (metadata.storage_data or {}).items():
        if getattr(index, "fqn", None) == key and hasattr(info, "relative_path"):
            return os.path.join(path, info.relative_path)
    return path


def _damaged_entry(template: Mapping[str, Any], path: str, metadata: Metadata) -> str | None:
    """After DCP failed to read: the first of this rank's entries that cannot be read alone, and
    its file (a diagnosis on the failure path only, so that the error names the entry)."""
    for key, _ in checksums.flatten(template):
        head, _, rest = key.partition(".")
        single: dict[str, Any] = {head: {rest: None}} if rest else {head: None}
        probe = _probe_value(template, head, rest)
        if rest:
            single[head][rest] = probe
        else:
            single[head] = probe
        try:
            _load_alone(single, path)
        except (Exception, CheckpointException):
            return f"{key!r} in {_file_of(metadata, key, path)}"
    return None


def _probe_value(template: Mapping[str, Any], head: str, rest: str) -> Any:
    """A fresh placeholder like the template's value of one entry (a tensor of its shape, or
    None for a pickled value)."""
    value = template[head][rest] if rest else template[head]
    return torch.empty_like(value) if isinstance(value, torch.Tensor) else None


def _same_run(parts: Parts, meta: Mapping[str, Any], private: Mapping[str, Any] | None) -> bool:
    """Whether this rank's private state (sync state, replica-own state) may be restored: only
    under the same plan and sync method. Otherwise warn: those start afresh."""
    method = parts.sync_method
    same = meta.get("plan") == parts.fingerprint() and meta.get("sync_method") == repr(method)
    if not same and (private is not None or parts.link.sync_state()):
        warnings.warn(
            f"graphpipe checkpoint: saved under another plan or sync method ({meta.get('sync_method')}, "
            f"{meta.get('world_size')} ranks) than this pipeline's ({method!r}, {parts.ranks.world_size} "
            f"ranks): rank {parts.rank} loads the shared parameters and optimizer state, and its sync method's "
            "state (local rounds, residuals, replica statistics) starts afresh",
            stacklevel=3,
        )
    return same


def _reason(exc: BaseException, path: str, entry: str | None = None) -> str:
    """One line naming what went wrong while reading (and the entry, where it is known), for
    every rank's InputError."""
    at = f" at the entry {entry}" if entry else ""
    first = _first_failure(exc) if isinstance(exc, CheckpointException) else None
    if first is not None:
        return (f"reading the checkpoint {path} failed on rank {first[0]}{at} ({describe(first[1])}); "
                "a shard file is missing or damaged")
    if isinstance(exc, InputError):
        return str(exc)
    return f"reading the checkpoint {path} failed{at} ({describe(exc)}); a file is missing or damaged"


def _read_metadata(path: str) -> tuple[Metadata, checksums.Manifest]:
    """DCP's metadata of the checkpoint ``path`` and its checksums, both checked. A save that
    died between the two renames of the fallback replacement is undone first."""
    try:
        recover(path)
    except OSError:
        pass  # another rank put it back first
    if not os.path.isdir(path):
        raise InputError(f"no checkpoint at {path}: the folder does not exist")
    manifest = checksums.Manifest.read(path)
    try:
        return dcp.FileSystemReader(path).read_metadata(), manifest
    except Exception as exc:
        raise InputError(f"{path} is not a readable checkpoint: its metadata file (.metadata) is missing or "
                         f"damaged ({type(exc).__name__}: {exc})") from exc


def _template(metadata: Metadata, own: Mapping[str, torch.Tensor], module: nn.Module, optimizer: Any,
              model_keys: list[str]) -> dict[str, Any]:
    """What this rank reads, as fresh tensors (never its own), after checking the metadata
    against what it holds: the checkpoint's model must be this one."""
    entries = metadata.state_dict_metadata
    if _META not in entries:
        raise InputError("it is not a graphpipe checkpoint (no 'graphpipe' record): write it with Pipeline.save")
    saved = sorted(k[len(_MODEL):] for k in entries if k.startswith(_MODEL))
    if sorted(model_keys) != saved:
        missing = sorted(set(model_keys) - set(saved))
        unknown = sorted(set(saved) - set(model_keys))
        raise InputError(f"the checkpoint is of another model: it lacks {len(missing)} of this model's entries "
                         f"(e.g. {missing[:3]}) and has {len(unknown)} this model lacks (e.g. {unknown[:3]})")
    model: dict[str, torch.Tensor] = {}
    for key, tensor in own.items():
        md = entries[_MODEL + key]
        if not isinstance(md, TensorStorageMetadata):
            raise InputError(f"the checkpoint's {key!r} is not a tensor")
        if tuple(md.size) != tuple(tensor.shape) or md.properties.dtype != tensor.dtype:
            raise InputError(f"the checkpoint is of another model: its {key!r} is {tuple(md.size)} "
                             f"{md.properties.dtype}, this model's is {tuple(tensor.shape)} {tensor.dtype}")
        model[key] = torch.empty_like(tensor, device="cpu")
    template: dict[str, Any] = {"model": model, _META: None}
    if optimizer is not None:
        optim = _optimizer_template(entries, module, optimizer)
        if optim:
            template["optim"] = optim
    return template


def _optimizer_template(entries: Mapping[str, Any], module: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The flat optimizer entries of this rank's parameters that the checkpoint has: fresh
    tensors of the stored shapes, placeholders for the rest. Every hyperparameter of this
    optimizer's groups must be there."""
    names = {id(p): n for n, p in module.named_parameters()}
    mine: dict[str, str] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise InputError("the optimizer holds a parameter that is not this rank's stage's: build it over "
                                 "pipe.parameters()")
            if _has_saved_state(names[id(p)]):
                mine[names[id(p)]] = ""
    optim: dict[str, Any] = {}
    has_any = any(k.startswith(_OPTIM) for k in entries)
    if not has_any:
        return optim
    for key, md in entries.items():
        if not key.startswith(_OPTIM):
            continue
        inner = key[len(_OPTIM):]
        section, _, rest = inner.partition(".")
        if section not in ("state", "param_groups") or _owner(rest, mine) is None:
            continue
        if isinstance(md, TensorStorageMetadata):
            optim[inner] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        elif isinstance(md, BytesStorageMetadata):
            optim[inner] = None
    for group in optimizer.param_groups:
        for p in group["params"]:
            if names[id(p)] not in mine:  # not _has_saved_state
                continue
            for k in group:
                if k != "params" and f"param_groups.{names[id(p)]}.{k}" not in optim:
                    raise InputError(f"the checkpoint has no optimizer hyperparameter {k!r} of {names[id(p)]!r}: "
                                     f"it was saved with another optimizer than {type(optimizer).__name__}, or "
                                     "without this parameter")
    return optim


def _has_saved_state(fqn: str) -> bool:
    """Whether a checkpoint must hold the optimizer state of the parameter ``fqn``: every one but
    the placeholder of a rank without parameters (no stage, or a parameter-free one), which only
    exists so that torch's optimizers can be built there, never changes, and which no rank
    without a stage saves."""
    return fqn != NO_PARAMETERS


def _owner(rest: str, mine: Mapping[str, Any]) -> str | None:
    """The FQN among ``mine`` that a flat key's tail (``fqn.name``) belongs to; FQNs have dots,
    so try every split."""
    parts = rest.split(".")
    for i in range(len(parts) - 1, 0, -1):
        fqn = ".".join(parts[:i])
        if fqn in mine:
            return fqn
    return None


def _checked(template: dict[str, Any], own: Mapping[str, torch.Tensor], module: nn.Module,
             optimizer: Any) -> dict[str, Any]:
    """What DCP read, checked for what it will be applied to (before any rank applies)."""
    meta = _unpickle(template[_META], "the checkpoint's graphpipe record")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"the checkpoint's format is {meta.get('format') if isinstance(meta, dict) else meta!r}, "
                         f"this graphpipe reads format {FORMAT}")
    optim = template.get("optim")
    if optimizer is not None:
        if meta.get("optimizer") is None:
            warnings.warn("graphpipe checkpoint: it was saved without optimizer state; the optimizer is left as it "
                          "is", stacklevel=4)
            optim = None
        elif meta["optimizer"] != type(optimizer).__name__:
            raise InputError(f"the checkpoint's optimizer is {meta['optimizer']}, this one is "
                             f"{type(optimizer).__name__}")
        elif optim is not None:
            _optimizer_state_from_flat(module, optimizer, optim)  # the conversion must succeed
    return {"meta": meta, "model": template["model"], "optim": optim}


# ---- applying ---------------------------------------------------------------------------------
def _copy_into(own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> None:
    """In place, so that optimizers keep their parameters."""
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(state[key])


def _optimizer_state_from_flat(module: nn.Module, optimizer: Any, flat: Mapping[str, Any]) -> dict[str, Any]:
    """``optimizer.load_state_dict``'s form of a flat FQN-keyed optimizer state: the inverse of
    torch's ``_flatten_optim_state_dict`` for this optimizer's parameters, in its groups."""
    names = {id(p): n for n, p in module.named_parameters()}
    state: dict[int, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    index = 0
    for group in optimizer.param_groups:
        ids: list[int] = []
        hyper: dict[str, Any] = {}
        for p in group["params"]:
            fqn = names[id(p)]
            prefix = f"state.{fqn}."
            entry: dict[str, Any] = {}
            for key, value in flat.items():
                if key.startswith(prefix):
                    _set_nested(entry, key[len(prefix):].split("."), value)
            if entry:
                state[index] = entry
            for k in group:
                if k == "params":
                    continue
                # The placeholder keeps its own hyperparameters where the checkpoint has none.
                key = f"param_groups.{fqn}.{k}"
                value = flat[key] if _has_saved_state(fqn) else flat.get(key, group[k])
                if k in hyper and not _equal(hyper[k], value):
                    raise InputError(f"the checkpoint's {k!r} differs between the parameters of one of this "
                                     f"optimizer's groups ({hyper[k]!r} and {value!r} at {fqn!r}): group them "
                                     "as they were grouped when saved")
                hyper[k] = value
            ids.append(index)
            index += 1
        groups.append({**hyper, "params": ids})
    return {"state": state, "param_groups": groups}


def _set_nested(entry: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        entry = entry.setdefault(part, {})
    entry[parts[-1]] = value


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    return bool(a == b)


def _load_flat_optimizer_state(module: nn.Module, optimizer: Any, flat: Mapping[str, Any]) -> None:
    optimizer.load_state_dict(_optimizer_state_from_flat(module, optimizer, flat))


# ---- the plain model ------------------------------------------------------------------------
def _load_alone(template: dict[str, Any], path: str) -> None:
    """DCP's load in this process alone (no process group, even inside a distributed job)."""
    with warnings.catch_warnings():
        # DCP warns that it assumes a single process: that is the point here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(template, storage_reader=dcp.FileSystemReader(path), no_dist=True)


def _read_alone(template: dict[str, Any], path: str, metadata: Metadata) -> None:
    """:func:`_load_alone`, whose failure names the entry that could not be read."""
    try:
        _load_alone(template, path)
    except CheckpointException as exc:
        raise InputError(_reason(exc, path, _damaged_entry(template, path, metadata))) from exc


def load_into_model(model: nn.Module, path: str | os.PathLike, optimizer: torch.optim.Optimizer | None = None
                    ) -> dict[str, Any]:
    """Loads a checkpoint written by ``Pipeline.save`` into the plain, single-process ``model``
    (and ``optimizer``, over ``model.parameters()``), with DCP and no process group. Reads into
    fresh tensors and applies only when everything was read; raises ``InputError`` naming the
    problem otherwise. Returns the ``extra`` it was saved with."""
    path = os.fspath(path)
    own = {k: v for k, v in model.state_dict().items()}
    try:
        metadata, manifest = _read_metadata(path)
        template = _template(metadata, own, model, optimizer, model_keys=list(own))
        _read_alone(template, path, metadata)
        _verify(manifest, metadata, template, path)
        loaded = _checked(template, own, model, optimizer)
    except InputError as exc:
        raise InputError(f"load_into_model({path!r}): {exc}") from exc
    except (Exception, CheckpointException) as exc:
        raise InputError(f"load_into_model({path!r}): {_reason(exc, path)}") from exc
    _copy_into(own, loaded["model"])
    if optimizer is not None and loaded["optim"] is not None:
        _load_flat_optimizer_state(model, optimizer, loaded["optim"])
    return dict(loaded["meta"]["extra"])


def model_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The plain model's state dict from a checkpoint, on the calling process alone (no process
    group, no other rank involved): the memory-bounded alternative to
    ``Pipeline.full_state_dict()``, which gathers every shard to every rank. It holds the model's
    tensors once; the optimizer state is not read. For a ``torch.save`` file of everything, use
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(path, file)``."""
    path = os.fspath(path)
    try:
        metadata, manifest = _read_metadata(path)
        entries = metadata.state_dict_metadata
        model = {k[len(_MODEL):]: torch.empty(tuple(md.size), dtype=md.properties.dtype)
                 for k, md in entries.items() if k.startswith(_MODEL) and isinstance(md, TensorStorageMetadata)}
        if _META not in entries or not model:
            raise InputError("it is not a graphpipe checkpoint (no 'graphpipe' record or no model entries)")
        template: dict[str, Any] = {"model": model, _META: None}
        _read_alone(template, path, metadata)
        _verify(manifest, metadata, template, path)
        meta = _unpickle(template[_META], "the checkpoint's graphpipe record")
    except InputError as exc:
        raise InputError(f"model_state_dict({path!r}): {exc}") from exc
    except (Exception, CheckpointException) as exc:
        raise InputError(f"model_state_dict({path!r}): {_reason(exc, path)}") from exc
    # In the original model's key order, as Pipeline.full_state_dict returns it.
    return {k: model[k] for k in meta["model_keys"] if k in model}
