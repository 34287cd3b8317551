"""Drafter folders for other engines (`blockdraft export DRAFTER --for zlab|vllm|sglang`).

Our native folder is already the released DFlash format; what differs per consumer is what it can
express. Every consumer builds the same Qwen3-style layer (q/k/v/o biases when `attention_bias`) and
reads the backbone keys `layers.{i}...`, `fc.weight`, `hidden_norm.weight`, `norm.weight` with
`dflash_config.{mask_token_id,target_layer_ids}`. Beyond that (read from their loader code):

- `zlab`, the reference package (`dflash` 0.1.0, `DFlashDraftModel.from_pretrained` + `dflash_generate`):
  embeds the block as the target's raw table times `dflash_config.input_embedding_scale` and scores it
  with the target's whole LM head, soft-capped by `dflash_config.final_logit_softcapping`.
- `vllm` (0.33.0, `DFlashQwen3ForCausalLM`): a reduced vocabulary is `draft_vocab_size`, a tensor `d2t`
  of offsets (draft id i scores target id i + d2t[i]) and the kept LM-head rows as `lm_head.weight`.
  Its DFlash layer neither scales input embeddings nor soft-caps logits; a scaled embedding is shipped
  as the target's scaled table in `embed_tokens.weight` (which it then keeps instead of sharing).
- `sglang` (0.5.23, `DFlashDraftModel`): drafts greedily over the target's whole vocabulary, embedding
  with the target model's own embedding module (Gemma 3's scales by sqrt(H)); unknown tensors are ignored.

DFlash 2 (`DFlash2DraftModel`, read from vLLM's `DFlash2Qwen3ForCausalLM` and SGLang's `DFlash2DraftModel`;
sources in docs/export.md): both engines read the released tensor names and the `dflash_config` fields
`conv_kernel_size`, `conv_group_size`, `selector_rank`, `selector_top_k` (and `output_multiplier`,
`final_logit_softcapping`, which they apply to the candidates' logits as the reference does); both need
the selector fields; both take each slot's candidates from the target's whole LM head, with codebooks over
the whole vocabulary and no draft-to-target map, so a reduced vocabulary is exact for neither. vLLM's
DFlash 2 model multiplies the target's raw table by `input_embedding_scale` itself.

What is exact: the backbone, always. Heads (Markov, confidence, DeLS local, Domino) are this library's
and are dropped with a note; the plain backbone is a drafter of its own. A reduced draft vocabulary
(our `vocab_map.d2t`: draft id i scores target id d2t[i] with the target's own LM-head row, and the
drafter's `q` is zero elsewhere) converts exactly for vLLM's DFlash. The rest score every target token,
and the rows we leave out were never trained against, so their drafts would differ: refused unless
`full_vocab=True`. A DSpark-layout drafter (its anchor slot predicts) has no exact form anywhere.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..config import ConfigError, DFlashConfig
from ..drafters.dflash import check_compatible
from ..files import UNTRAINED, atomic_write_folder, holds_trained_weights
from ..targets.transformers import Target
from .dflash import CONFIG_NAME, WEIGHTS_NAME, load_drafter_model, state_bytes

FOLDER_CONSUMERS = ("zlab", "vllm", "sglang")  # llama.cpp's GGUF file is engines/llamacpp_export.py's (the one
# entry point over both, and the table of what each consumer can express, is engines/export.py's CONSUMERS)


@dataclass
class Backbone:
    """What every export starts from (the folders here, llama.cpp's GGUF in `engines/llamacpp_export.py`)."""

    config: DFlashConfig
    state: dict[str, torch.Tensor]  # the backbone's tensors: no rotary cache, no vocabulary map, no heads
    d2t: torch.Tensor | None  # (V_draft,) int64 target id of each draft id; None: every token, in order
    heads: dict[str, Any]  # config.json `heads`: name -> description
    notes: list[str] = field(default_factory=list)  # one per thing dropped or converted


def load_backbone(drafter_dir: str | Path, consumer: str, *, runs_heads: Collection[str] = ()) -> Backbone:
    """The drafter's backbone, with a note for every head `consumer` does not run (`runs_heads` it does) and
    for a draft vocabulary map that keeps every token in order (dropped: the full vocabulary is the same)."""
    model = load_drafter_model(drafter_dir)  # validates the folder; heads stay in the file, unread
    config = model.config
    heads = dict(config.extra.get("heads") or {})
    notes = [f"dropped the {name} head (blockdraft's own; {consumer} has no such head): {consumer} drafts with the "
             "backbone alone, so its drafts differ from ours with the head on"
             for name in heads if name not in runs_heads]
    state = {key: tensor.detach().contiguous() for key, tensor in model.state_dict().items()
             if not key.startswith(("rotary_emb.", "vocab_map."))}
    d2t = None if model.vocab_map is None else model.vocab_map.d2t.to(torch.int64)
    if d2t is not None and torch.equal(d2t, torch.arange(config.vocab_size)):
        notes.append("dropped the draft vocabulary map: it kept every token in order")
        d2t = None
    return Backbone(config, state, d2t, heads, notes)


def reduced_vocabulary(d2t: torch.Tensor, lm_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """A reduced draft vocabulary as vLLM and llama.cpp read it: the target's LM-head rows it scores
    (`lm_head.weight`, (V_draft, H), as we score them) and `d2t` as offsets (draft id i scores target id
    i + d2t[i])."""
    return {"lm_head.weight": lm_head[d2t].contiguous(), "d2t": (d2t - torch.arange(d2t.numel())).contiguous()}


def export_drafter(drafter_dir: str | Path, out_dir: str | Path, consumer: str, *, target: Target | None = None,
                   full_vocab: bool = False, overwrite: bool = False) -> list[str]:
    """Write the folder `consumer` reads from the drafter at `drafter_dir`; returns one note per thing
    dropped or converted. `target` is needed only when the export reads target weights (vLLM with a
    DFlash drafter's reduced vocabulary or scaled embedding) or the drafter predates recording its scale.
    llama.cpp reads a GGUF file instead: `blockdraft.engines.llamacpp_export.export_drafter_gguf`."""
    if consumer == "llama.cpp":
        raise ConfigError("llama.cpp reads a GGUF file, written by blockdraft.engines.llamacpp_export."
                          "export_drafter_gguf(drafter, target, out_file) (the CLI: export --for llama.cpp)")
    if consumer not in FOLDER_CONSUMERS:
        raise ConfigError(f"--for must be one of {', '.join(FOLDER_CONSUMERS)} or llama.cpp, got {consumer!r}")
    backbone = load_backbone(drafter_dir, consumer)
    config, d2t, notes = backbone.config, backbone.d2t, backbone.notes
    if target is not None:
        check_compatible(config, target)
    if config.layout != "dflash":
        raise ConfigError(f"{drafter_dir} uses the {config.layout} layout (its anchor slot predicts too); the DFlash "
                          f"loader of {consumer} conditions on the anchor only, so it cannot reproduce this drafter")
    stored = _stored_dtype(Path(drafter_dir))
    state = {key: tensor.to(stored) for key, tensor in backbone.state.items()}
    scale, softcap = _embedding_and_cap(config, target, drafter_dir)
    config = dataclasses.replace(config, input_embedding_scale=scale, final_logit_softcapping=softcap,
                                 draft_vocab_size=None,
                                 extra={k: v for k, v in config.extra.items() if k != "heads"})
    if d2t is not None and consumer == "vllm" and not config.is_dflash2:
        head = _need(target, "vLLM reads a reduced vocabulary's LM-head rows from the drafter folder")
        state.update(reduced_vocabulary(d2t, head.lm_head.weight.detach().cpu()))  # rows in the target's dtype
        config = dataclasses.replace(config, draft_vocab_size=int(d2t.numel()))
        notes.append(f"converted the {d2t.numel()}-token draft vocabulary to vLLM's d2t offsets + lm_head rows")
    elif d2t is not None:
        if not full_vocab:
            raise ConfigError(_whole_vocabulary_refusal(consumer, config, d2t.numel()))
        notes.append(f"dropped the {d2t.numel()}-token draft vocabulary (--full-vocab): {consumer} drafts over all "
                     f"{config.vocab_size} tokens, so its drafts can differ from ours")

    if config.is_dflash2:
        config = _dflash2_parts(consumer, config, state, d2t, notes)
    if consumer == "vllm" and config.is_dflash2:
        notes.append(f"vLLM's DFlash 2 convolution takes its block length from num_speculative_tokens + 1, not "
                     f"block_size: serve this drafter with num_speculative_tokens = {config.block_size - 1}")
    if consumer == "vllm" and scale != 1.0 and not config.is_dflash2:  # vLLM's DFlash 2 model applies the scale
        embed = _need(target, "vLLM does not scale input embeddings, so the scaled table is shipped")
        with torch.no_grad():
            table = embed.embed_tokens(torch.arange(config.vocab_size, device=embed.device)[None])[0]
        state["embed_tokens.weight"] = table.cpu().contiguous()  # (V, H): what our drafter embeds
        # The shipped table is already scaled: a reader applying input_embedding_scale must not scale it again.
        config = dataclasses.replace(config, input_embedding_scale=1.0)
        notes.append(f"shipped the target's embedding table times {scale:g} as embed_tokens.weight: vLLM's DFlash "
                     "layer does not apply input_embedding_scale")
    if consumer == "vllm" and scale != 1.0:
        notes.append("vLLM (0.32-0.33) drafts only for targets that expose auxiliary hidden states (its EAGLE-3 "
                     "interface), which its Gemma 3 model does not yet: it refuses to serve this drafter there")
    if consumer == "sglang" and scale != 1.0:
        notes.append(f"SGLang embeds with the target model's own embedding module (scaled by {scale:g} for Gemma 3), "
                     "except under attention data parallelism, where it reads the raw table")
    if softcap is not None and consumer in ("vllm", "sglang") and not config.is_dflash2:
        notes.append(f"{consumer}'s DFlash drafter does not soft-cap logits ({softcap:g}): greedy drafts are unchanged"
                     + (", sampled drafts use uncapped q" if consumer == "vllm" else ""))

    # random weights stay marked as such: only they are replaced without --overwrite (files.holds_trained_weights)
    mark = {} if holds_trained_weights(drafter_dir) else dict([UNTRAINED])

    def write(folder: Path) -> None:
        (folder / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt", **mark})

    atomic_write_folder(Path(out_dir), write, overwrite=overwrite, need_bytes=state_bytes(state))
    return notes


def _whole_vocabulary_refusal(consumer: str, config: DFlashConfig, kept: int) -> str:
    """Why a reduced-vocabulary drafter is refused for `consumer`, and what to do instead."""
    if consumer == "vllm":  # reached only for DFlash 2: DFlash's d2t form is exact
        reader = ("vLLM's DFlash 2 drafter takes its candidates from the target's whole LM head and reads no "
                  "draft-to-target map (d2t)")
    else:
        reader = f"{consumer} drafts over the target's whole vocabulary"
    instead = "Pass --full-vocab" if config.is_dflash2 else "Export --for vllm (exact), or pass --full-vocab"
    return (f"{reader}, but this drafter scores only {kept} of its {config.vocab_size} tokens: its drafts there "
            f"would differ from ours. {instead} to export the backbone for {consumer} anyway (verification stays "
            "lossless; acceptance may change)")


def _dflash2_parts(consumer: str, config: DFlashConfig, state: dict[str, torch.Tensor], d2t: torch.Tensor | None,
                   notes: list[str]) -> DFlashConfig:
    """DFlash 2's convolutions export as they are; its candidate selector as each engine can read it.

    Every DFlash 2 loader builds the selector (the reference's `DFlash2DraftModel` always does; vLLM and
    SGLang fail without `selector_rank`, and vLLM leaves a tensor the folder lacks uninitialised): a drafter
    without one is written with a top-1 selector and zero codebooks, which drafts the backbone's argmax
    (what ours drafts greedily; at T > 0 the engine then drafts by argmax, still lossless). The engines'
    selectors read codebooks over the verifier's whole vocabulary: ours over a reduced draft vocabulary
    are spread to those rows (zeros elsewhere), reached only where the export drafts over every token
    (--full-vocab)."""
    selector_keys = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
    if not config.has_selector:
        stored = state["fc.weight"].dtype
        state["candidate_selector.hidden_projection.weight"] = torch.zeros(1, config.hidden_size, dtype=stored)
        for key in selector_keys:
            state[key] = torch.zeros(config.vocab_size, 1, dtype=stored)
        notes.append(f"no candidate selector: wrote a top-1 selector with zero codebooks, which {consumer}'s DFlash 2 "
                     "loader needs; it drafts the backbone's argmax (greedy drafts unchanged; at T > 0 it drafts by "
                     "argmax)")
        return dataclasses.replace(config, selector_rank=1, selector_top_k=1)
    if d2t is None:
        return config
    for key in selector_keys:
        rows = state[key]
        state[key] = rows.new_zeros(config.vocab_size, rows.shape[1]).index_copy_(0, d2t, rows)  # (V, r)
    notes.append(f"spread the selector's codebooks from the {d2t.numel()}-token draft vocabulary to all "
                 f"{config.vocab_size} tokens (zero rows elsewhere)")
    return config


def _stored_dtype(folder: Path) -> torch.dtype:
    with safe_open(str(folder / WEIGHTS_NAME), "pt") as handle:
        return handle.get_tensor("fc.weight").dtype


def _need(target: Target | None, why: str) -> Target:
    if target is None:
        raise ConfigError(f"{why}: pass --target (the model this drafter was trained for)")
    return target


def _embedding_and_cap(config: DFlashConfig, target: Target | None,
                       drafter_dir: str | Path) -> tuple[float, float | None]:
    """The input-embedding scale and final soft-cap our drafting uses: recorded in config.json since
    blockdraft records them; read from the target for older drafters."""
    if config.input_embedding_scale is not None:
        return config.input_embedding_scale, config.final_logit_softcapping
    target = _need(target, f"{drafter_dir}/config.json does not record dflash_config.input_embedding_scale "
                           "(saved by an earlier blockdraft), which every consumer needs")
    scale = target.input_embedding_scale
    if scale is None:
        raise ConfigError("the target's input embedding is not a constant multiple of its table, which no DFlash "
                          "loader can express; this drafter cannot be exported exactly")
    return scale, target.softcap or None
