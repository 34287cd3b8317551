"""What each engine an export writes for can express: one table, read by the writers.

Every consumer builds the same Qwen3-style DFlash layer from the backbone keys `layers.{i}...`, `fc.weight`,
`hidden_norm.weight`, `norm.weight` and `dflash_config.{mask_token_id,target_layer_ids}`. Where they differ
is a row of `CONSUMERS` (read from each engine's loader and model code at the version in `reader`):

- vocabulary: a reduced draft vocabulary (our `vocab_map.d2t`: draft id i scores target id d2t[i] with the
  target's own LM-head row, q is zero elsewhere) is exact where the engine reads `d2t` with the kept LM-head
  rows; the others score every target token, and the rows we left out were never trained against, so the
  export is refused unless `full_vocab` (a note says so). No engine's DFlash 2 reads a d2t: its candidates
  come from the target's whole LM head.
- embedding: `scale` multiplies the target's raw table by `dflash_config.input_embedding_scale`; `table`
  embeds with `embed_tokens.weight` as shipped (a scaled embedding ships as the target's scaled table);
  `module` embeds with the target model's own embedding module (Gemma 3's scales by sqrt(H)).
- soft-cap: whether its DFlash layer applies `final_logit_softcapping` (every DFlash 2 model does); when
  not, what that changes.
- heads: Markov, confidence, DeLS local and Domino heads are this library's; each engine runs the ones in
  `runs_heads` (llama.cpp's DSpark graph: the linear Markov head, the confidence head on Markov features)
  and the others are dropped with a note (the backbone is a drafter of its own).
- layout and biases: the DSpark layout (the anchor slot predicts) and q/k/v/o attention biases.

A new engine is one row here and, if it reads neither a folder nor a GGUF file, one writer (`__init__.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: the export options, by the flag that sets them
OPTION_FLAGS = {"full_vocab": "--full-vocab", "outtype": "--outtype", "drop_attention_bias": "--drop-attention-bias"}
WRITES = ("folder", "GGUF file")
EMBEDDINGS = ("scale", "table", "module")


@dataclass(frozen=True)
class Consumer:
    """An engine an export writes for: what it reads and what of our drafters it can express."""

    name: str  # the `--for` value
    label: str  # how notes name the engine
    reader: str  # the loader this row was read from
    writes: str  # "folder" or "GGUF file"
    options: tuple[str, ...] = ()  # the export options that shape it (any other is refused: it would be ignored)
    needs_target: str | None = None  # why the target is required; None: read only when the drafter needs it
    draft_vocabulary: bool = False  # reads a DFlash drafter's reduced vocabulary as d2t + the kept LM-head rows
    embedding: str = "scale"  # how its DFlash layer embeds the block (EMBEDDINGS; the module doc)
    scaled_embedding_note: str | None = None  # what to say where the drafter's embedding is scaled ({scale:g})
    softcap_ignored: str | None = None  # None: its DFlash layer soft-caps logits; else what ignoring the cap changes
    runs_heads: tuple[str, ...] = ()  # our heads it runs; every other head is dropped with a note
    dspark_layout: bool = False  # runs a drafter whose anchor slot predicts too
    attention_bias: bool = True  # its DFlash layer has q/k/v/o biases (Qwen2-family drafters)
    dflash2_block_from_proposals: bool = False  # its DFlash 2 convolution's block is num_speculative_tokens + 1

    def __post_init__(self) -> None:
        if self.writes not in WRITES:
            raise ValueError(f"{self.name}: writes must be one of {WRITES}, got {self.writes!r}")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"{self.name}: embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")
        unknown = set(self.options) - set(OPTION_FLAGS)
        if unknown:
            raise ValueError(f"{self.name}: unknown export options {sorted(unknown)} (known: {sorted(OPTION_FLAGS)})")
        if self.embedding == "table" and self.writes != "folder":
            raise ValueError(f"{self.name}: a shipped embedding table is written only into folders")


CONSUMERS: dict[str, Consumer] = {consumer.name: consumer for consumer in (
    Consumer("zlab", "the reference dflash package",
             "dflash 0.1.0: DFlashDraftModel.from_pretrained + dflash_generate", "folder", ("full_vocab",)),
    Consumer("vllm", "vLLM", "vLLM 0.33.0: DFlashQwen3ForCausalLM, DFlash2Qwen3ForCausalLM", "folder", ("full_vocab",),
             draft_vocabulary=True, embedding="table",
             scaled_embedding_note="vLLM (0.32-0.33) drafts only for targets that expose auxiliary hidden states "
                                   "(its EAGLE-3 interface), which its Gemma 3 model does not yet: it refuses to "
                                   "serve this drafter there",
             softcap_ignored="greedy drafts are unchanged, sampled drafts use uncapped q",
             dflash2_block_from_proposals=True),
    Consumer("sglang", "SGLang", "SGLang 0.5.23: DFlashDraftModel, DFlash2DraftModel", "folder", ("full_vocab",),
             embedding="module",
             scaled_embedding_note="SGLang embeds with the target model's own embedding module (scaled by {scale:g} "
                                   "for Gemma 3), except under attention data parallelism, where it reads the raw "
                                   "table",
             softcap_ignored="greedy drafts are unchanged"),
    Consumer("llama.cpp", "llama.cpp", "llama.cpp 11434: convert_hf_to_gguf.py (DFlash, DSpark) and its dflash graph",
             "GGUF file", ("outtype", "drop_attention_bias"),
             needs_target="the converter reads the target's tokenizer", draft_vocabulary=True,
             runs_heads=("markov", "confidence"), dspark_layout=True, attention_bias=False),
)}


def folder_consumers() -> tuple[str, ...]:
    """The consumers that read a drafter folder."""
    return tuple(name for name, consumer in CONSUMERS.items() if consumer.writes == "folder")
