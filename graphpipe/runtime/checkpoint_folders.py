"""Where a save writes, and how the written checkpoint replaces the old one in one step.

A save never changes a complete checkpoint in place: every rank writes into a sibling folder
``<path>.tmp-<save id>``, and only after every shard, DCP's ``.metadata`` and graphpipe's
manifest are written and flushed does rank 0 put it in place of ``path``:

- over an existing ``path``, by exchanging the two folders with one ``renameat2(RENAME_EXCHANGE)``
  (Linux 3.15+; glibc's function, called through ctypes because Python's ``os`` has no binding):
  at every instant ``path`` is either the old checkpoint or the new one, and the old one is left at
  the temporary name and removed afterwards;
- where the file system cannot exchange (``EINVAL``/``ENOSYS``: some network file systems), by
  moving the old folder aside (``<path>.old-<save id>``) and renaming the new one in: a save
  killed between those two renames leaves ``path`` missing and the old checkpoint complete at
  ``<path>.old-<save id>``, which :func:`recover` puts back before the next load or save;
- over no ``path``, by a plain rename.

The parent folder is fsynced after each rename, so that the rename itself survives a crash.
Folders left by a save that died (``.tmp-*``, and ``.old-*`` beside a complete ``path``) are
removed by the next save's rank 0 before it writes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import glob
import os
import shutil
import uuid

__all__ = ["new_save_id", "recover", "remove_leftovers", "replace", "staging_folder"]

_TMP = ".tmp-"
_OLD = ".old-"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def new_save_id() -> str:
    """A fresh identifier for one save (rank 0's; the others use it)."""
    return uuid.uuid4().hex[:12]


def staging_folder(path: str, save_id: str) -> str:
    """The folder one save writes into before it replaces ``path``."""
    return f"{path}{_TMP}{save_id}"


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Swaps the folders ``a`` and ``b`` atomically; False where the file system cannot."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"renameat2(RENAME_EXCHANGE) of {a} and {b}: {os.strerror(code)}")


def replace(path: str, staged: str, save_id: str) -> None:
    """Puts the complete checkpoint ``staged`` in place of ``path`` (see the module docstring)
    and removes the old one."""
    parent = os.path.dirname(path) or "."
    _fsync_folder(staged)
    if not os.path.exists(path):
        os.rename(staged, path)
        _fsync_folder(parent)
        return
    if _exchange(staged, path):
        _fsync_folder(parent)
        shutil.rmtree(staged, ignore_errors=True)  # now the old checkpoint
        return
    aside = f"{path}{_OLD}{save_id}"
    os.rename(path, aside)
    os.rename(staged, path)
    _fsync_folder(parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover(path: str) -> None:
    """Puts back the old checkpoint of a save that died between the two renames of the fallback
    (``path`` missing, ``<path>.old-<id>`` complete). Nothing to do otherwise."""
    if os.path.exists(path):
        return
    for aside in sorted(glob.glob(glob.escape(path) + _OLD + "*")):
        os.rename(aside, path)
        _fsync_folder(os.path.dirname(path) or ".")
        return


def remove_leftovers(path: str, keep: str) -> list[str]:
    """Removes the folders of saves of ``path`` that died (``.tmp-*``; ``.old-*`` once ``path``
    is there again), except ``keep``; returns what it removed."""
    recover(path)
    removed = []
    pattern = glob.escape(path)
    for leftover in glob.glob(pattern + _TMP + "*") + glob.glob(pattern + _OLD + "*"):
        if os.path.abspath(leftover) != os.path.abspath(keep):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed
