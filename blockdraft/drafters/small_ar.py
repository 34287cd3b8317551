"""Small-AR-draft baseline: any causal LM sharing the tokenizer drafts K tokens one by one."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..config import ConfigError, SamplingConfig
from ..decode.sampling import choose
from ..decode.target import TargetModel
from ..targets import load_target
from ..decode.proposal import Proposal


class SmallARDrafter:
    """Classic speculative decoding draft with its own KV cache (Leviathan et al. 2023)."""

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, model: TargetModel | PreTrainedModel | str, target: TargetModel, num_proposals: int = 4):
        self.model = load_target(model, dtype=target.dtype, device=target.device)
        if self.model.vocab_size != target.vocab_size:
            raise ConfigError(
                f"draft model vocabulary ({self.model.vocab_size}) differs from the target's ({target.vocab_size}); "
                "a small-AR draft must share the target's tokenizer")
        if num_proposals < 1:
            raise ConfigError(f"num_proposals must be >= 1, got {num_proposals}")
        self.max_proposals = num_proposals
        self._target = target
        self.cache = None
        self.cached_tokens: list[int] = []  # the tokens whose keys/values the draft cache holds, in order

    def spawn(self) -> "SmallARDrafter":
        """The same draft model with its own cache: one per row of a batch."""
        return SmallARDrafter(self.model, self._target, num_proposals=self.max_proposals)

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        self.cache = self.model.open_rows()  # the draft model's own cache
        self.cache.forward(prompt_ids, 0, logits_to_keep=1)
        self.cached_tokens = prompt_ids[0].tolist()

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        # Keep the cache's longest prefix that agrees with the committed tokens: after a chain round
        # that is the accepted drafts, after a tree round only what the accepted branch shares.
        committed = ids[0, :-1].tolist()
        keep = 0
        for cached, token in zip(self.cached_tokens, committed):
            if cached != token:
                break
            keep += 1
        if keep < len(self.cached_tokens):
            self.cache.crop(keep)
            del self.cached_tokens[keep:]
        pending = ids[:, keep:]  # committed tokens the draft has not seen, ending with the anchor
        tokens, dists, logits = [], [], []
        for _ in range(min(num_proposals, self.max_proposals)):
            out = self.cache.forward(pending, len(self.cached_tokens), logits_to_keep=1)
            self.cached_tokens.extend(pending[0].tolist())
            token, probs = choose(out.logits[0, -1], sampling, generator, argmax=sampling.draft_argmax)
            logits.append(out.logits[0, -1])
            tokens.append(token)
            dists.append(probs)
            pending = token.view(1, 1)
        proposal = torch.stack(tokens) if tokens else ids.new_empty(0)
        q_draft = torch.stack(dists) if dists and dists[0] is not None else None
        return Proposal(tokens=proposal, q_draft=q_draft, logits=torch.stack(logits) if logits else None)

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        pass  # the next `propose` compares its cache with the committed tokens
