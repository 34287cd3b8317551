"""The two parts DFlash 2 adds to the DFlash backbone: the block convolution and the candidate selector.

**Block convolution** (a grouped dynamic causal convolution). Around every attention and MLP sublayer
of a draft layer, with x = norm(h) and d_t = kernel_projection(x_t):

    x'_t = sum_{o<K} base[0, o] * x_{t-o} + d_t[0, o] (x) x_{t-o}      (before the sublayer)
    y'_t = sum_{o<K} base[1, o] * y_{t-o} + d_t[1, o] (x) y_{t-o}      (after it: y = sublayer(x'))
    h    = h + y'

`base` (2, K, H) is a per-channel kernel; the dynamic kernel d_t (2, K, H/g) gives one tap per group
of g channels, computed from the position's own normed input. Taps reach back over the block's own
slots only, zero-padded at its first slot: a block never reads another block (training lays many
blocks side by side). Initialised as the identity (base[:, 0] = 1, other taps and the projection 0),
a fresh DFlash 2 computes exactly its DFlash 1 backbone.

**Candidate selector.** The backbone's per-slot logits U_k are marginals: each slot ignores what the
slots before it drafted. The selector keeps each slot's `top_k` tokens by U_k and walks the block left
to right from the anchor, scoring candidate b of slot k against the token drafted before it:

    S_k(b) = U_k(b) + < A[prev] * (W h_k), B[b] >      A, B (V, r) codebooks, W (r, H)

Greedy takes argmax_b S_k(b). At T > 0 slot k draws from q_k = softmax(S_k / T) over its candidates;
the verifier sees q_k as a distribution over the whole vocabulary (its candidates' probabilities at
their token ids, zero elsewhere), so the usual min(1, p/q) rule with residual norm(max(0, p - q)) stays
lossless: the draft was drawn from exactly that q.

With a reduced draft vocabulary the codebooks cover the draft vocabulary (draft ids); an anchor outside
it has no predecessor row and scores slot 1 by U_1 alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SamplingConfig
from ..decode.sampling import sample, to_probs


class BlockConv(nn.Module):
    """One sublayer's grouped dynamic causal convolution, before (side 0) and after (side 1) it."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))  # (side, tap, H)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The identity: the sublayer sees x and returns y unchanged."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def around(self, sublayer, x: torch.Tensor, block_length: int | None = None) -> torch.Tensor:
        """sublayer(conv_0(x)) convolved again (conv_1), both with x's dynamic kernel.

        x (N, T, H) holds blocks of `block_length` slots side by side (None: one block of T slots).
        """
        n, t, _ = x.shape
        dynamic = self.kernel_projection(x).view(n, t, 2, self.kernel_size, self.groups)  # (N, T, side, K, G)
        y = sublayer(self._convolve(x, dynamic[:, :, 0], self.base_kernel[0], block_length))
        return self._convolve(y, dynamic[:, :, 1], self.base_kernel[1], block_length)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor,
                  block_length: int | None) -> torch.Tensor:
        """x (N, T, H), dynamic (N, T, K, G), base (K, H) -> (N, T, H); taps stay inside each block."""
        n, t, hidden = x.shape
        length = t if block_length is None else block_length
        slot = torch.arange(t, device=x.device) % length  # (T,) slot index inside its block
        grouped = x.view(n, t, self.groups, hidden // self.groups)  # (N, T, G, g)
        out = torch.zeros_like(grouped)
        for offset in range(self.kernel_size):
            shifted = grouped if offset == 0 else F.pad(grouped[:, :t - offset], (0, 0, 0, 0, offset, 0))
            if offset:  # the first `offset` slots of every block have no slot that far back
                shifted = shifted * (slot >= offset).to(x.dtype)[None, :, None, None]
            out = out + base[offset].view(1, 1, self.groups, -1).to(x.dtype) * shifted
            out = torch.addcmul(out, dynamic[:, :, offset, :, None], shifted)
        return out.view(n, t, hidden)


class CandidateSelector(nn.Module):
    """DFlash 2's left-to-right walk over each slot's top-k candidates (released key names)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)  # W
        # Stored without `.weight`, as the released checkpoints hold them.
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # A
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # B
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """W = 0: a fresh selector scores by U alone (greedy picks the backbone's argmax), while the
        random codebooks give W a gradient from the first step."""
        self.hidden_projection.weight.zero_()
        nn.init.normal_(self.predecessor_codebook)
        nn.init.normal_(self.successor_codebook)

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(..., V) logits -> (unary (..., k) float32, ids (..., k)), best first."""
        unary, ids = torch.topk(logits.float(), self.top_k, dim=-1)
        return unary, ids

    def pair_scores(self, projected: torch.Tensor, previous: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """< A[previous] * projected, B[ids] >: projected (..., r), previous (...) ids (-1 = none), ids (..., k)
        -> (..., k) float32."""
        rows = self.predecessor_codebook[previous.clamp(min=0)].float() * (previous >= 0)[..., None]
        return torch.einsum("...r,...kr->...k", rows * projected.float(), self.successor_codebook[ids].float())

    def block_scores(self, hidden: torch.Tensor, logits: torch.Tensor,
                     previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced scores of whole blocks: hidden (n, K, H), logits (n, K, V), previous (n, K) the
        token before each slot (the anchor for slot 1, then the labels; -1 = outside the vocabulary).
        Returns (S (n, K, top_k) float32, candidate ids (n, K, top_k)): what `walk` scores at each slot when
        it walked the same tokens."""
        unary, ids = self.candidates(logits)
        return unary + self.pair_scores(self.hidden_projection(hidden).float(), previous, ids), ids

    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int, sampling: SamplingConfig,
             generator: torch.Generator | None, *, argmax: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One row's block: hidden (k, H), logits (k, V) over the selector's vocabulary, anchor its id there
        (-1 = outside it). Returns (tokens (k,), q (k, V) float32 or None when chosen by argmax)."""
        unary, ids = self.candidates(logits)  # (k, top_k) each
        projected = self.hidden_projection(hidden).float()  # (k, r)
        greedy = sampling.greedy or argmax
        tokens, q_rows = [], []
        previous = torch.tensor(anchor, device=logits.device)
        for slot in range(logits.shape[0]):
            scores = unary[slot] + self.pair_scores(projected[slot], previous, ids[slot])  # (top_k,)
            if greedy:
                index = scores.argmax()
            else:
                q_candidates = to_probs(scores, sampling)  # (top_k,)
                index = sample(q_candidates, generator)
                # q over the vocabulary: each candidate's probability at its token id (ids are distinct).
                q_rows.append(torch.zeros(logits.shape[-1], device=logits.device).index_add_(0, ids[slot], q_candidates))
            previous = ids[slot, index]
            tokens.append(previous)
        empty = torch.empty(0, dtype=torch.long, device=logits.device)
        tokens = torch.stack(tokens) if tokens else empty
        if greedy:
            return tokens, None
        return tokens, torch.stack(q_rows) if q_rows else logits.new_zeros(0, logits.shape[-1], dtype=torch.float32)
