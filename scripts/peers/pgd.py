"""Reads a Peregrine dataset file (kernels/src/data/format.rs) into numpy arrays, in place
(memory-mapped), so that every peer trains on exactly the rows Peregrine trains on."""
import struct

import numpy as np

SPARSE, DENSE, RATINGS = 1, 2, 3


def header(path):
    """(kind, rows, cols, nonzeros, classes, users, sections) from a dataset's 192-byte header."""
    with open(path, "rb") as f:
        h = f.read(192)
    if h[:8] != b"PRGRNDS\0":
        raise SystemExit(f"{path}: not a Peregrine dataset (magic {h[:8]!r})")
    version, kind, rows, cols, nnz, classes, _truth, users = struct.unpack_from("<IIQQQIIQ", h, 8)
    if version != 1:
        raise SystemExit(f"{path}: dataset version {version}, this reader knows 1")
    sections = [struct.unpack_from("<QQ", h, 56 + 16 * i) for i in range(6)]
    return kind, rows, cols, nnz, classes, users, sections


def _section(path, sections, i, dtype):
    off, size = sections[i]
    return np.memmap(path, dtype=dtype, mode="r", offset=off, shape=(size // np.dtype(dtype).itemsize,))


def dense(path):
    """(features rows x cols f32, labels u32 -> int64, classes)."""
    kind, rows, cols, _, classes, _, s = header(path)
    if kind != DENSE:
        raise SystemExit(f"{path}: kind {kind}, expected a dense dataset")
    x = _section(path, s, 0, np.float32).reshape(rows, cols)
    y = _section(path, s, 1, np.uint32).astype(np.int64)
    return x, y, classes


def sparse(path):
    """(scipy CSR matrix f32, labels 0/1 f32)."""
    import scipy.sparse as sp
    kind, rows, cols, nnz, _, _, s = header(path)
    if kind != SPARSE:
        raise SystemExit(f"{path}: kind {kind}, expected a sparse dataset")
    ptr = _section(path, s, 0, np.uint64).astype(np.int64)
    idx = _section(path, s, 1, np.uint32).astype(np.int32)
    val = _section(path, s, 2, np.float32)
    y = np.array(_section(path, s, 3, np.float32))
    return sp.csr_matrix((np.array(val), idx, ptr), shape=(rows, cols)), y


def ratings(path):
    """(users u32, items u32, ratings f32, number of users, number of items)."""
    kind, rows, cols, _, _, users, s = header(path)
    if kind != RATINGS:
        raise SystemExit(f"{path}: kind {kind}, expected a ratings dataset")
    u = np.array(_section(path, s, 0, np.uint32))
    i = np.array(_section(path, s, 1, np.uint32))
    r = np.array(_section(path, s, 2, np.float32))
    return u, i, r, users, cols
