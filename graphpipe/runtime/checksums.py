"""Checksums of a checkpoint's entries: computed at save on the values handed to DCP, stored in the
checkpoint's manifest, verified at load on the values DCP read, before anything is applied.

DCP itself checks only the structure of what it reads (a damaged zip record fails ``torch.load``);
bytes flipped inside a tensor's data load silently. Every entry of a graphpipe checkpoint (every
tensor, every pickled record, every non-tensor optimizer value) therefore gets an XXH3-64 digest
(the ``xxhash`` package: a maintained C implementation, several GB/s per core) of its bytes:

- a tensor: its elements' bytes in row-major order (read through a ``uint8`` view, so every dtype,
  bfloat16 included, hashes without conversion);
- a ``bytes`` value (graphpipe's pickled records): the bytes themselves;
- anything else (an optimizer's hyperparameters): its pickle, which round-trips through DCP.

The manifest (``graphpipe.checksums.json``) holds every entry's digest, the digest of DCP's
``.metadata`` file, and a digest of its own body, so a damaged manifest is refused as such. Its
presence also marks a complete checkpoint: rank 0 writes it after DCP's metadata, last of all.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import xxhash

from graphpipe.errors import InputError

__all__ = ["MANIFEST", "Manifest", "digest", "digests", "flatten"]

#: The manifest's file name inside a checkpoint folder.
MANIFEST = "graphpipe.checksums.json"
_METADATA = ".metadata"
_ALGORITHM = "xxh3_64"


def digest(value: Any) -> str:
    """The hex digest of one entry's value (see the module docstring for what is hashed)."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        data = flat.contiguous().view(torch.uint8).numpy()
        return xxhash.xxh3_64_hexdigest(memoryview(data))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return xxhash.xxh3_64_hexdigest(value)
    return xxhash.xxh3_64_hexdigest(pickle.dumps(value, protocol=4))


def flatten(state: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The leaves of a nested state dict under DCP's flattened keys (``a.b.c``)."""
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten(value, f"{name}.")
        else:
            yield name, value


def digests(state: Mapping[str, Any]) -> dict[str, str]:
    """Every leaf of ``state``'s digest, by flattened key."""
    return {key: digest(value) for key, value in flatten(state)}


def _file_digest(path: str) -> str:
    hasher = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            hasher.update(chunk)
    return hasher.hexdigest()


def _body_digest(body: Mapping[str, Any]) -> str:
    return xxhash.xxh3_64_hexdigest(json.dumps(body, sort_keys=True).encode())


class Manifest:
    """A checkpoint's checksums: ``entries`` (flattened key -> digest) and ``metadata`` (the
    digest of DCP's ``.metadata`` file)."""

    def __init__(self, entries: Mapping[str, str], metadata: str) -> None:
        self.entries = dict(entries)
        self.metadata = metadata

    @classmethod
    def of_folder(cls, folder: str, entries: Mapping[str, str]) -> Manifest:
        """The manifest of a folder that DCP finished writing (its ``.metadata`` is there)."""
        return cls(entries, _file_digest(os.path.join(folder, _METADATA)))

    def write(self, folder: str) -> None:
        """Writes the manifest into ``folder`` and flushes it to storage (fsync)."""
        body = {"algorithm": _ALGORITHM, "metadata": self.metadata, "entries": self.entries}
        text = json.dumps({**body, "self": _body_digest(body)}, sort_keys=True)
        with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def read(cls, folder: str) -> Manifest:
        """The manifest of ``folder``, checked against itself and against ``.metadata``;
        ``InputError`` naming what is wrong otherwise."""
        where = os.path.join(folder, MANIFEST)
        if not os.path.exists(where):
            raise InputError(
                f"{folder} has no checksums ({MANIFEST}): it is not a complete graphpipe checkpoint (a save that "
                "died before its end, or one written by a graphpipe older than checkpoint format 2)"
            )
        try:
            with open(where, encoding="utf-8") as f:
                raw = json.load(f)
            body = {k: raw[k] for k in ("algorithm", "metadata", "entries")}
            own = raw["self"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"the checksum file {where} is damaged ({type(exc).__name__}: {exc})") from exc
        if _body_digest(body) != own or body["algorithm"] != _ALGORITHM:
            raise InputError(f"the checksum file {where} is damaged (its own checksum does not match)")
        manifest = cls(body["entries"], body["metadata"])
        actual = _file_digest(os.path.join(folder, _METADATA)) if os.path.exists(os.path.join(folder, _METADATA)) \
            else None
        if actual is None:
            raise InputError(f"{folder} has no DCP metadata file (.metadata)")
        if actual != manifest.metadata:
            raise InputError(f"the checkpoint's metadata file {os.path.join(folder, _METADATA)} is damaged: its "
                             f"checksum {actual} is not the saved {manifest.metadata}")
        return manifest

    def mismatch(self, state: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """The first entry of ``state`` (a template DCP read into) whose digest is not the saved
        one, as (key, saved digest, read digest); None when all match. An entry the manifest
        lacks is a mismatch too (saved digest "none")."""
        for key, value in flatten(state):
            saved = self.entries.get(key)
            read = digest(value)
            if saved != read:
                return key, saved or "none", read
        return None
