"""Row statistics of a factored square circuit, streamed over cache-sized tiles with bounded memory."""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Iterable

import torch

from models.arch.tl_compat import FactoredMatrix

from .checks import analysis_dtype, as_index, check_finite, check_matrix
from .interface import serial_ops

DEFAULT_BLOCK_BYTES = 2**20  # one tile of the product: 1 MiB, so that it is reduced while in cache
TILE_COLS = 1024  # columns per tile
CHUNK = 256  # columns per chunk maximum (4 per tile)


def diagonal_rank_stats(fm: FactoredMatrix | torch.Tensor, k: int | Iterable[int] = (1, 5),
                        block_bytes: int = DEFAULT_BLOCK_BYTES) -> dict[int, torch.Tensor]:
    """Top-k "diagonal accuracy" of a square circuit: the fraction of rows i whose own entry `[i, i]` is within
    the top k of row i, for each k asked (k=1: the diagonal entry is the row's maximum).

    rank_i = #{j : M[i, j] > M[i, i]} (ties count in the diagonal's favour); top-k accuracy = mean_i [rank_i < k].
    For a full OV circuit `W_E W_OV W_U` this is the fraction of source tokens whose own logit is raised most
    (ARENA 1.2, "Full OV circuit: top-1 / top-5 diagonal accuracy"; Framework, "copying"). The product is formed
    one tile at a time (`A[rows] @ B[:, cols]`, at most `block_bytes` per tile), in the input dtype, never the
    whole matrix: each cache-sized tile is reduced to maxima over column chunks as soon as it is computed, and
    only the few rows those maxima leave undecided are counted exactly. Extra memory: a padded copy of B and one
    tile per worker thread. Vectorised over leading dims: returns `{k: tensor[...]}` (float64, on the input's
    device). Several heads together (ARENA's "1.4 and 1.10"): their circuits' sum is the factored matrix
    `FactoredMatrix(torch.cat([A1, A2], -1), torch.cat([B1, B2], -2))`. float16/bfloat16 factors are ranked in
    float32; NaN/inf in a factor raises `NonFiniteError` (a `ValueError`).
    """
    if isinstance(k, (str, bytes)) or not hasattr(k, "__iter__"):
        k = (k,)
    ks = tuple(as_index(kk, "k") for kk in k)
    if not ks or min(ks) < 1:
        raise ValueError(f"k must be positive integers, got {ks}")
    check_matrix(fm, "diagonal_rank_stats")
    if not isinstance(fm, FactoredMatrix):
        fm = FactoredMatrix(fm, torch.eye(fm.shape[-1], dtype=fm.dtype, device=fm.device))
    if fm.ldim != fm.rdim:
        raise ValueError(f"diagonal statistics need a square matrix, got shape {tuple(fm.shape)}")
    n, lead = fm.ldim, tuple(fm.shape[:-2])
    wd = analysis_dtype(fm.A)  # rankings are never taken in half precision: ties and a slow CPU path
    A = fm.A.detach().to(wd).reshape(-1, n, fm.mdim)
    B = fm.B.detach().to(wd).reshape(-1, fm.mdim, n)
    check_finite({"factor A": A, "factor B": B}, "diagonal_rank_stats")  # NaN compares False: ranks would lie
    ranks = torch.stack([_diagonal_ranks(A[i], B[i], max(ks), block_bytes) for i in range(A.shape[0])])
    acc = torch.stack([(ranks < kk).to(torch.float64).mean(-1) for kk in ks], -1).reshape(*lead, len(ks))
    return {kk: acc[..., i].to(fm.A.device) for i, kk in enumerate(ks)}


def _diagonal_ranks(A: torch.Tensor, B: torch.Tensor, k_max: int, block_bytes: int) -> torch.Tensor:
    """min(rank_i, k_max) for every row of `A @ B` (`[n, m] @ [m, n]`), rank_i = #{j : M[i, j] > M[i, i]}.

    A product of at most `block_bytes` is formed whole and its ranks counted on it. A larger one is formed one
    cache-sized tile (`rows × TILE_COLS`, at most `block_bytes`) at a time and each
    tile is reduced at once to its maxima over column chunks of `CHUNK`, while it is still in cache. A row
    with no chunk above its diagonal has rank 0; one with ≥ k_max such chunks has rank ≥ k_max; only rows in
    between are counted exactly, by recomputing their (< k_max) chunks above the diagonal. (Entries that tie
    the diagonal to within rounding may count either way.) Row blocks are shared among
    `torch.get_num_threads()` Python threads running single-threaded ops: thousands of small ops parallelise
    better that way than with a barrier inside each one (see `serial_ops`)."""
    n, m = A.shape
    if n * n * A.element_size() <= block_bytes:  # the whole product is one tile: count on it directly
        M = A @ B
        return (M > M.diagonal()[:, None]).sum(-1).clamp(max=k_max)
    ct = max(1, min(TILE_COLS // CHUNK, -(-n // CHUNK))) * CHUNK  # tile width, a multiple of CHUNK
    n_tiles = -(-n // ct)
    B_tiles = B.new_zeros(m, n_tiles * ct)
    B_tiles[:, :n] = B
    B_tiles = B_tiles.view(m, n_tiles, ct).permute(1, 0, 2).contiguous()  # [tile, m, ct]
    rows = max(1, min(n, block_bytes // (ct * A.element_size())))
    out = torch.empty(n, dtype=torch.int64, device=A.device)
    starts = list(range(0, n, rows))
    workers = max(1, min(torch.get_num_threads(), len(starts))) if A.device.type == "cpu" else 1
    job = functools.partial(_rank_rows, A, B_tiles, B.transpose(0, 1), n, rows, ct, k_max, out)
    if workers == 1:
        job(starts)
        return out
    with serial_ops(), concurrent.futures.ThreadPoolExecutor(workers) as pool:  # MKL's count is global
        list(pool.map(job, [starts[w::workers] for w in range(workers)]))
    return out


def _rank_rows(A, B_tiles, Bt, n, rows, ct, k_max, out, starts) -> None:
    """`_diagonal_ranks` for the row blocks beginning at `starts`, with this worker's own buffers."""
    with serial_ops():
        _rank_rows_serial(A, B_tiles, Bt, n, rows, ct, k_max, out, starts)


def _rank_rows_serial(A, B_tiles, Bt, n, rows, ct, k_max, out, starts) -> None:
    n_tiles, per_tile = B_tiles.shape[0], ct // CHUNK
    n_chunks, tail = n_tiles * per_tile, n - (n_tiles - 1) * ct  # tail: valid columns of the last tile
    tile_buf = A.new_empty(rows, ct)  # reused: fresh allocations cost page faults, and this stays in cache
    cmax = A.new_empty(n_tiles, rows, per_tile)
    offsets = torch.arange(CHUNK, device=A.device)
    for start in starts:
        r = min(rows, n - start)
        A_blk = A[start:start + r]
        diag = A.new_empty(r)
        for j in range(n_tiles):
            tile = torch.mm(A_blk, B_tiles[j], out=tile_buf[:r])  # [r, ct]
            if j == n_tiles - 1 and tail < ct:
                tile[:, tail:] = float("-inf")
            lo, hi = max(start, j * ct), min(start + r, (j + 1) * ct)
            if lo < hi:  # this tile holds some of the block's diagonal entries
                i = torch.arange(lo, hi, device=A.device)
                diag[i - start] = tile[i - start, i - j * ct]
            torch.amax(tile.view(r, per_tile, CHUNK), -1, out=cmax[j, :r])
        above = cmax[:, :r].permute(1, 0, 2).reshape(r, n_chunks) > diag[:, None]  # [r, chunks]
        n_above = above.sum(-1)
        rank = n_above.clamp(max=k_max)
        unsure = ((n_above > 0) & (n_above < k_max)).nonzero().squeeze(-1)
        if len(unsure):
            flags = above[unsure]
            which = flags.to(A.dtype).topk(min(k_max - 1, n_chunks), dim=-1).indices  # [u, q] chunks
            cols = which[..., None] * CHUNK + offsets  # [u, q, CHUNK]
            row_ids = start + unsure
            # the diagonal's own column is never "above" itself: it is excluded rather than compared, since its
            # recomputation below may round differently from the appended copy (one BLAS path or another)
            valid = (flags.gather(-1, which)[..., None] & (cols < n) & (cols != row_ids[:, None, None])).flatten(1)
            cols = torch.cat([cols.clamp(max=n - 1).flatten(1), row_ids[:, None]], 1)  # + the diagonal
            vals = (Bt[cols] @ A[row_ids][..., None]).squeeze(-1)  # [u, q·CHUNK + 1], one kernel per row
            rank[unsure] = ((vals[:, :-1] > vals[:, -1:]) & valid).sum(-1)
        out[start:start + r] = rank
