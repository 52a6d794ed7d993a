"""Row statistics of a factored square circuit, streamed over row blocks with bounded memory."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformer_lens import FactoredMatrix

DEFAULT_BLOCK_BYTES = 32 * 2**20  # one row block of the product: 32 MiB


def diagonal_rank_stats(fm: FactoredMatrix | torch.Tensor, k: int | Iterable[int] = (1, 5),
                        block_bytes: int = DEFAULT_BLOCK_BYTES) -> dict[int, torch.Tensor]:
    """Top-k "diagonal accuracy" of a square circuit: the fraction of rows i whose own entry `[i, i]` is within
    the top k of row i, for each k asked (k=1: the diagonal entry is the row's maximum).

    rank_i = #{j : M[i, j] > M[i, i]} (ties count in the diagonal's favour); top-k accuracy = mean_i [rank_i < k].
    For a full OV circuit `W_E W_OV W_U` this is the fraction of source tokens whose own logit is raised most
    (ARENA 1.2, "Full OV circuit: top-1 / top-5 diagonal accuracy"; Framework, "copying"). The product is formed
    one block of rows at a time (`A[rows] @ B`, at most `block_bytes` per block), in the input dtype, never the
    whole matrix. Vectorised over leading dims: returns `{k: tensor[...]}` (float64, on the input's device).
    """
    ks = (k,) if isinstance(k, int) else tuple(k)
    if not ks or min(ks) < 1:
        raise ValueError(f"k must be positive integers, got {ks}")
    if not isinstance(fm, FactoredMatrix):
        fm = FactoredMatrix(fm, torch.eye(fm.shape[-1], dtype=fm.dtype, device=fm.device))
    if fm.ldim != fm.rdim:
        raise ValueError(f"diagonal statistics need a square matrix, got shape {tuple(fm.shape)}")
    n, lead = fm.ldim, tuple(fm.shape[:-2])
    A = fm.A.detach().reshape(-1, n, fm.mdim)
    B = fm.B.detach().reshape(-1, fm.mdim, n)
    rows = max(1, min(n, block_bytes // max(1, n * A.element_size())))
    kt = torch.tensor(ks, device=A.device)
    counts = torch.zeros(A.shape[0], len(ks), dtype=torch.int64, device=A.device)
    for m in range(A.shape[0]):
        Bm = B[m]
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            block = A[m, start:stop] @ Bm  # [rows, n]
            idx = torch.arange(start, stop, device=A.device)
            diag = block[idx - start, idx]  # [rows]
            rank = torch.count_nonzero(block > diag[:, None], dim=-1)  # [rows]
            counts[m] += (rank[:, None] < kt).sum(0)
    acc = (counts.to(torch.float64) / n).reshape(*lead, len(ks))
    return {kk: acc[..., i] for i, kk in enumerate(ks)}
