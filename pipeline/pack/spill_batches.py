"""A batch's arrays as a spill's files (pipeline/pack/spill.py): split by split, written by an encode worker
into the writer's ``incoming/`` directory (:func:`write_batch_files`), and appended to the split files in
the kernel (:func:`append_file`, ``copy_file_range``) as the batch's turn comes."""

from __future__ import annotations

import errno
import os
import shutil

import numpy as np


INCOMING = "incoming"  # in a spill being written: the workers' batch files (write_batch_files), each appended, then deleted
BATCH_KINDS = ("tokens", "mask", "keys", "bands")  # the split files a batch appends to, in this order (bands:
# near dedup's band keys, only where the spill keeps them)


def split_batch(tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray, prompt_lengths: np.ndarray,
                is_val: np.ndarray, keys: np.ndarray, bands: np.ndarray | None = None) -> dict[str, tuple]:
    """One batch's documents by split, ``is_val``'s in val, each split's (tokens, masks, lengths,
    prompt lengths, keys, band keys or None).

    >>> out = split_batch(np.array([5, 6, 7]), np.array([0, 1, 1]), np.array([1, 2]), np.array([1, 1]),
    ...                   np.array([False, True]), np.array([[1], [2]]))
    >>> {split: [a.tolist() for a in arrays[:5]] for split, arrays in out.items()}
    {'train': [[5], [0], [1], [1], [[1]]], 'val': [[6, 7], [1, 1], [2], [1], [[2]]]}
    """
    if not is_val.any():  # the common case: no copy, the whole batch is training data
        return {"train": (tokens, masks, lengths, prompt_lengths, keys, bands),
                "val": (tokens[:0], masks[:0], lengths[:0], prompt_lengths[:0], keys[:0],
                        None if bands is None else bands[:0])}
    val_tokens = np.repeat(is_val, lengths)
    return {split: (tokens[selected], masks[selected], lengths[docs], prompt_lengths[docs], keys[docs],
                    None if bands is None else bands[docs])
            for split, selected, docs in (("train", ~val_tokens, ~is_val), ("val", val_tokens, is_val))}


def as_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of ``array`` in C order, as a flat uint8 array: no copy where it is contiguous."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def kind_arrays(tokens: np.ndarray, masks: np.ndarray, keys: np.ndarray, bands: np.ndarray | None) -> tuple:
    """A split's arrays in :data:`BATCH_KINDS` order, as their files hold them (band keys where given)."""
    return (tokens, masks, keys.astype(np.uint8, copy=False)) + (() if bands is None else (bands.astype("<u8", copy=False),))


def batch_file(prefix: str, split: str, kind: str) -> str:
    return f"{prefix}.{split}.{kind}"


def write_batch_files(prefix: str, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray, is_val: np.ndarray,
                      keys: np.ndarray, bands: np.ndarray | None = None) -> None:
    """Write one batch's token arrays (``tokens`` in the spill's dtype; ``bands``, where the spill keeps
    them) as files ``prefix.<split>.<kind>``, for spill.py's ``SpillWriter.add_batch_files`` (``prefix``: its
    ``SpillWriter.incoming``); a split without documents gets none."""
    for split, (split_tokens, split_masks, split_lengths, _, split_keys, split_bands) in split_batch(
            tokens, masks, lengths, lengths, is_val, keys, bands).items():
        if len(split_lengths):
            for kind, array in zip(BATCH_KINDS, kind_arrays(split_tokens, split_masks, split_keys, split_bands)):
                with open(batch_file(prefix, split, kind), "wb") as f:
                    f.write(as_bytes(array))


def append_file(path: str, out) -> None:
    """Append the file ``path`` to the open file ``out``, copied in the kernel (``copy_file_range``),
    then delete it. Where that call is missing or refused (:data:`NO_KERNEL_COPY`), or copies nothing
    before the file's end (a file system that does not implement it), the rest of the bytes come through
    this process, as Go's, Rust's and Portage's copies do; spill.py's ``SpillWriter.close`` checks every size."""
    out.flush()
    with open(path, "rb") as f:
        size, done = os.fstat(f.fileno()).st_size, 0
        try:
            while done < size:
                copied = os.copy_file_range(f.fileno(), out.fileno(), size - done)
                if copied == 0:
                    break  # nothing copied short of the end: not on this file system
                done += copied
        except (AttributeError, OSError) as e:  # no copy_file_range here (not Linux), or not on this file system
            if isinstance(e, OSError) and e.errno not in NO_KERNEL_COPY:
                raise
        if done < size:
            f.seek(done)
            shutil.copyfileobj(f, out, 1 << 20)
            out.flush()
    os.unlink(path)


NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM}
"""copy_file_range's refusals that the copy through this process follows: an old kernel (ENOSYS), another
file system (EXDEV), one that cannot (EINVAL, EOPNOTSUPP), and a container's seccomp filter, which answers
EPERM for a call it does not allow (older Docker profiles, CircleCI, snaps: golang/go#40893, rust-lang/rust#75428)."""
