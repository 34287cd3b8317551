"""Drafter folders for other engines (`blockdraft export DRAFTER --for zlab|vllm|sglang`).

Our native folder is already the released DFlash format; what differs per consumer is what it can
express, one row of `consumers.CONSUMERS` each (vocabulary, embedding, soft-cap, heads), which this
writer follows. What is exact: the backbone, always. A reduced draft vocabulary converts exactly where the
engine reads `d2t` (vLLM's DFlash); elsewhere it is refused unless `full_vocab`. A DSpark-layout drafter (its
anchor slot predicts) has no exact form in any folder consumer: their DFlash loaders condition on the
anchor only.

DFlash 2 (`DFlash2DraftModel`, read from vLLM's `DFlash2Qwen3ForCausalLM` and SGLang's `DFlash2DraftModel`;
sources in docs/export.md): both engines read the released tensor names and the `dflash_config` fields
`conv_kernel_size`, `conv_group_size`, `selector_rank`, `selector_top_k` (and `output_multiplier`,
`final_logit_softcapping`, which they apply to the candidates' logits as the reference does); both need
the selector fields; both take each slot's candidates from the target's whole LM head, with codebooks over
the whole vocabulary and no draft-to-target map, so a reduced vocabulary is exact for neither. vLLM's
DFlash 2 model multiplies the target's raw table by `input_embedding_scale` itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..checkpoints.dflash import CONFIG_NAME, WEIGHTS_NAME, state_bytes
from ..config import ConfigError, DFlashConfig
from ..drafters.dflash import check_compatible
from ..files import UNTRAINED, atomic_write_folder, holds_trained_weights
from .backbone import load_backbone, reduced_vocabulary
from .consumers import CONSUMERS, Consumer, folder_consumers

if TYPE_CHECKING:
    from ..targets.transformers import Target


def export_drafter(drafter_dir: str | Path, out_dir: str | Path, consumer: str, *, target: Target | None = None,
                   full_vocab: bool = False, overwrite: bool = False) -> list[str]:
    """Write the folder `consumer` reads from the drafter at `drafter_dir`; returns one note per thing
    dropped or converted. `target` is needed only when the export reads target weights (an engine with
    `draft_vocabulary` and a DFlash drafter's reduced vocabulary, or one embedding with a shipped `table`
    and a scaled embedding) or the drafter predates recording its scale."""
    entry = _folder_consumer(consumer)
    backbone = load_backbone(drafter_dir, entry)
    config, d2t, notes = backbone.config, backbone.d2t, backbone.notes
    if target is not None:
        check_compatible(config, target)
    if config.layout != "dflash" and not entry.dspark_layout:
        raise ConfigError(f"{drafter_dir} uses the {config.layout} layout (its anchor slot predicts too); the DFlash "
                          f"loader of {consumer} conditions on the anchor only, so it cannot reproduce this drafter")
    stored = _stored_dtype(Path(drafter_dir))
    state = {key: tensor.to(stored) for key, tensor in backbone.state.items()}
    scale, softcap = _embedding_and_cap(config, target, drafter_dir)
    config = dataclasses.replace(config, input_embedding_scale=scale, final_logit_softcapping=softcap,
                                 draft_vocab_size=None,
                                 extra={k: v for k, v in config.extra.items() if k != "heads"})
    if d2t is not None and entry.draft_vocabulary and not config.is_dflash2:
        head = _need(target, f"{entry.label} reads a reduced vocabulary's LM-head rows from the drafter folder")
        state.update(reduced_vocabulary(d2t, head.lm_head.weight.detach().cpu()))  # rows in the target's dtype
        config = dataclasses.replace(config, draft_vocab_size=int(d2t.numel()))
        notes.append(f"converted the {d2t.numel()}-token draft vocabulary to {entry.label}'s d2t offsets + lm_head rows")
    elif d2t is not None:
        if not full_vocab:
            raise ConfigError(_whole_vocabulary_refusal(entry, config, d2t.numel()))
        notes.append(f"dropped the {d2t.numel()}-token draft vocabulary (--full-vocab): {consumer} drafts over all "
                     f"{config.vocab_size} tokens, so its drafts can differ from ours")

    if config.is_dflash2:
        config = _dflash2_parts(consumer, config, state, d2t, notes)
    if entry.dflash2_block_from_proposals and config.is_dflash2:
        notes.append(f"{entry.label}'s DFlash 2 convolution takes its block length from num_speculative_tokens + 1, "
                     f"not block_size: serve this drafter with num_speculative_tokens = {config.block_size - 1}")
    if entry.embedding == "table" and scale != 1.0 and not config.is_dflash2:  # DFlash 2 models apply the scale
        embed = _need(target, f"{entry.label} does not scale input embeddings, so the scaled table is shipped")
        with torch.no_grad():
            table = embed.embed_tokens(torch.arange(config.vocab_size, device=embed.device)[None])[0]
        state["embed_tokens.weight"] = table.cpu().contiguous()  # (V, H): what our drafter embeds
        # The shipped table is already scaled: a reader applying input_embedding_scale must not scale it again.
        config = dataclasses.replace(config, input_embedding_scale=1.0)
        notes.append(f"shipped the target's embedding table times {scale:g} as embed_tokens.weight: {entry.label}'s "
                     "DFlash layer does not apply input_embedding_scale")
    if entry.scaled_embedding_note is not None and scale != 1.0:
        notes.append(entry.scaled_embedding_note.format(scale=scale))
    if softcap is not None and entry.softcap_ignored is not None and not config.is_dflash2:
        notes.append(f"{consumer}'s DFlash drafter does not soft-cap logits ({softcap:g}): {entry.softcap_ignored}")

    # random weights stay marked as such: only they are replaced without --overwrite (files.holds_trained_weights)
    mark = {} if holds_trained_weights(drafter_dir) else dict([UNTRAINED])

    def write(folder: Path) -> None:
        (folder / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt", **mark})

    atomic_write_folder(Path(out_dir), write, overwrite=overwrite, need_bytes=state_bytes(state))
    return notes


def _folder_consumer(consumer: str) -> Consumer:
    """The table's row for a consumer that reads a folder, or a named error."""
    entry = CONSUMERS.get(consumer)
    if entry is None:
        others = [name for name in CONSUMERS if name not in folder_consumers()]
        raise ConfigError(f"--for must be one of {', '.join(folder_consumers())} or {' or '.join(others)}, "
                          f"got {consumer!r}")
    if entry.writes != "folder":
        raise ConfigError(f"{consumer} reads a {entry.writes}, written by blockdraft.export.gguf.export_drafter_gguf("
                          f"drafter, target, out_file) (the CLI: export --for {consumer})")
    return entry


def _whole_vocabulary_refusal(entry: Consumer, config: DFlashConfig, kept: int) -> str:
    """Why a reduced-vocabulary drafter is refused for `entry`, and what to do instead."""
    if entry.draft_vocabulary:  # reached only for DFlash 2: DFlash's d2t form is exact
        reader = (f"{entry.label}'s DFlash 2 drafter takes its candidates from the target's whole LM head and reads "
                  "no draft-to-target map (d2t)")
    else:
        reader = f"{entry.name} drafts over the target's whole vocabulary"
    exact = " or ".join(name for name in folder_consumers() if CONSUMERS[name].draft_vocabulary)
    instead = "Pass --full-vocab" if config.is_dflash2 else f"Export --for {exact} (exact), or pass --full-vocab"
    return (f"{reader}, but this drafter scores only {kept} of its {config.vocab_size} tokens: its drafts there "
            f"would differ from ours. {instead} to export the backbone for {entry.name} anyway (verification stays "
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
