"""Blocked ELLPACK kernels for sparse projections (`vijax.projections.Sparse`).

H ``(N, D)`` is stored as each row's column indices and values padded to the longest row, ``(N_pad, width)``
(``layout``); the products run over blocks of rows (``mv`` a gather, ``rmv`` and ``gram`` a scatter-add), in cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["layout", "mv", "rmv", "gram", "MAX_PADDING"]

_ROW_ALIGN = 1024  # rows padded to a multiple of this (or of N's next power of two), so power-of-two blocks divide them
_BLOCK_ELEMENTS = 1 << 19  # a block holds about this many gathered elements (block rows × width × K)
MAX_PADDING = 8  # rows longer than this many times the mean make the padded layout wasteful: keep BCOO


def layout(H):
    """Column indices, positions in ``H.data`` and validity, each ``(N_pad, width)``; None if not possible."""
    if isinstance(H.indices, jax.core.Tracer) or H.nse == 0:
        return None
    indices = np.asarray(H.indices)
    num_rows = H.shape[0]
    rows, columns = indices[:, 0], indices[:, 1]
    order = np.argsort(rows, kind="stable")
    counts = np.bincount(rows, minlength=num_rows)
    width = int(counts.max())
    if width > MAX_PADDING * max(counts.mean(), 1.0):
        return None
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(order.size) - starts[rows[order]]
    align = min(_ROW_ALIGN, 1 << int(np.ceil(np.log2(num_rows))))
    padded_rows = -(-num_rows // align) * align
    ell_columns = np.zeros((padded_rows, width), np.int32)
    position = np.zeros((padded_rows, width), np.int64)
    valid = np.zeros((padded_rows, width), bool)
    ell_columns[rows[order], slot] = columns[order]
    position[rows[order], slot] = order
    valid[rows[order], slot] = True
    return ell_columns, position, valid


def _block_rows(padded, row_elements):
    """Rows a block: a power of two dividing ``padded``, holding about `_BLOCK_ELEMENTS` elements."""
    target = max(_BLOCK_ELEMENTS // max(row_elements, 1), 1)
    return int(min(2 ** int(np.log2(target)), _ROW_ALIGN, padded & -padded))


def mv(columns, values, x, num_rows):
    padded, width = columns.shape
    x = jnp.asarray(x)
    b = _block_rows(padded, width * int(np.prod(x.shape[1:], dtype=int)))
    blocks = (columns.reshape(-1, b, width), values.reshape(-1, b, width))
    out = jax.lax.map(lambda cv: jnp.einsum("bw,bw...->b...", cv[1], x[cv[0]]), blocks)
    return out.reshape((padded,) + x.shape[1:])[:num_rows]


def rmv(columns, values, y, dim):
    padded, width = columns.shape
    y = jnp.asarray(y)
    b = _block_rows(padded, width * int(np.prod(y.shape[1:], dtype=int)))
    y = jnp.pad(y, ((0, padded - y.shape[0]),) + ((0, 0),) * (y.ndim - 1))
    blocks = (columns.reshape(-1, b, width), values.reshape(-1, b, width), y.reshape((-1, b) + y.shape[1:]))

    def accumulate(total, block):
        c, v, yb = block
        contributions = jnp.einsum("bw,b...->bw...", v, yb)
        return total.at[c.reshape(-1)].add(contributions.reshape((-1,) + yb.shape[1:])), None

    zero = jnp.zeros((dim,) + y.shape[1:], jnp.result_type(values, y))
    return jax.lax.scan(accumulate, zero, blocks)[0]


def gram(columns, values, w, dim):
    """Hᵀ diag(w) H, ``(dim, dim)``: each block of rows scatters its outer products w_n h_n h_nᵀ, never N × D."""

    padded, width = columns.shape
    w = jnp.pad(jnp.asarray(w), (0, padded - w.shape[0]))
    b = _block_rows(padded, width * width)
    blocks = (columns.reshape(-1, b, width), values.reshape(-1, b, width), w.reshape(-1, b))

    def accumulate(total, block):
        c, v, wb = block
        outer = wb[:, None, None] * v[:, :, None] * v[:, None, :]
        rows = jnp.broadcast_to(c[:, :, None], outer.shape).reshape(-1)
        cols = jnp.broadcast_to(c[:, None, :], outer.shape).reshape(-1)
        return total.at[rows, cols].add(outer.reshape(-1)), None

    zero = jnp.zeros((dim, dim), jnp.result_type(values, w))
    return jax.lax.scan(accumulate, zero, blocks)[0]
