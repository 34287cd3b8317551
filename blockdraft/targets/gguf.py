"""The llama.cpp engine: a GGUF file run by llama.cpp's kernels as the target `p`, and its rows cache.

`GGUFTarget` answers what `decode/target.py` declares (`TargetModel`: the layer features a DFlash drafter
reads, the frozen token embedding and LM head it borrows, `eos_token_ids`, `features`), and `GGUFCache`
(`RowsCache`: `prefill`, `verify`, `keep`, `drop`, `forward`, `crop`, `close`) is its rows cache, opened by
`open_rows`. The loop never asks which target it has. The `gguf` package is read only when a GGUF file is
(`engines/gguf_arch.py` defers it), so `import blockdraft` loads neither it nor llama.cpp's library.

How rows and trees map onto llama.cpp's memory (one context, `kv_unified`, cells tagged by sequence ids):
- each row is one sequence, its tokens at their own positions; rows never see each other's cells;
- a tree's node i attends as its own sequence t_i (llama.cpp masks a query by its *first* sequence id:
  a cell is visible when it carries that id and sits at a position <= the query's), and its cell also
  carries the ids of every descendant, so each node sees exactly the row's past (copied into t_i by
  `seq_cp`, which only tags cells), the anchor and its ancestors — DDTree's tree attention (Ringel and
  Romano 2026) from sequence tags, with positions start + depth;
- after the round the row's sequence takes the accepted path's cells (`seq_cp` from the deepest kept
  node's sequence over the path's positions) and every node sequence is removed, so the memory holds the
  committed path as if it had been verified as a chain.
llama.cpp allows 256 sequence ids: rows plus one per tree node of a round must fit.

Layer ids follow our convention (`l` = the output of decoder layer l); llama.cpp captures layer *inputs*,
so layer l is its input l + 1 (`llama_get_embeddings_layer_inp`).
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch import nn
from transformers import AutoTokenizer

from ..config import ConfigError, validate_layer_ids
from ..decode.target import TargetOutput, head_logits
from ..devices import parse_dtype
from ..engines.gguf_arch import open_gguf
from ..engines.llamacpp import IK_LLAMACPP, LLAMACPP, EngineError, gguf_engine
from ..engines.gguf_header import check_gguf_numbers
from ..engines.llamacpp_cache import runnable_target_gguf
from .llama_lib import MAX_SEQUENCES, LlamaEngine, check_context, check_threads, loaded_engine

if TYPE_CHECKING:  # a type only: the cache knows proposals by their tokens and tree parents
    from ..decode.proposal import Proposal

GGUF_MAGIC = b"GGUF"
#: llama.cpp 11434 graphs that record every layer's input (`res->t_layer_inp[il]`), so a DFlash drafter can
#: read their features; a Qwen2 GGUF runs its llama copy there (`blockdraft engines as-llama`, docs/llamacpp.md).
#: ik_llama.cpp reads any architecture's: its shim takes each layer's output by the name its graphs give it
#: (`l_out-<i>`, `ik_shim.cpp`), and a graph that did not name it is refused at the first read.
CAPTURING_ARCHITECTURES = frozenset({"llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "gemma4",
                                     "openai-moe", "minimax-m2", "hunyuan-vl", "nanbeige", "mimo2"})


def is_gguf(path: str | Path) -> bool:
    """A path naming a GGUF file (by its magic, or its suffix when it cannot be read)."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".gguf" and not path.is_dir():
        return True
    if not path.is_file():  # a folder, a FIFO or a device is no GGUF (and a FIFO would block the read)
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def check_gguf_file(path: str | Path) -> Path:
    """`path` when it is a readable GGUF file, else a ConfigError saying what it is."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path} is not a file: give a GGUF model file as the target")
    with open(path, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{path} is not a GGUF file (no GGUF magic): convert the model with llama.cpp's "
                              "convert_hf_to_gguf.py (in the `blockdraft engines build llama.cpp` tree)")
    return path


def accepts(source) -> bool:
    """A path naming a GGUF file (`is_gguf`)."""
    return isinstance(source, (str, Path)) and is_gguf(source)


def load(source: str | Path, *, dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
         threads: int | None = None, n_ctx: int | None = None) -> "GGUFTarget":
    """The GGUF file `source` as a target: `threads` are llama.cpp's (default: torch's), `n_ctx` its context
    cells shared by all rows (default 4096), `dtype` that of the embedding and LM head drafters borrow; it runs
    on the CPU. A Qwen2 file runs as its llama-architecture copy (the same weights, made once under
    $BLOCKDRAFT_HOME), whose llama.cpp graph exposes the layer features a DFlash drafter reads
    (`engines/gguf_arch.py`)."""
    if device is not None and torch.device(device).type != "cpu":
        raise ConfigError(f"a GGUF target runs on llama.cpp's CPU build; --device {device} is not available "
                          "for it (use the model's Hugging Face folder for a GPU)")
    # ik_llama.cpp's shim reads layer inputs from every graph (its eval callback), so the file runs as it is
    arch = "native" if gguf_engine() is not LLAMACPP else "auto"
    check_gguf_numbers(check_gguf_file(source))  # bounded metadata and sane numbers before any copy is made
    runnable = runnable_target_gguf(check_gguf_file(source), arch=arch, drafts=True,
                                    log=lambda line: print(line, file=sys.stderr))
    return GGUFTarget(runnable, dtype=dtype, threads=threads, n_ctx=n_ctx or 4096, name=str(source))


class GGUFTarget:
    """A frozen GGUF decoder run by llama.cpp on the CPU (`decode/target.py::TargetModel`).

    `n_ctx` is the context's cells, shared by every row, tree node and open cache; `threads` llama.cpp's
    threads; `dtype` the dtype of the embedding and LM head the drafters borrow (and so of their passes).
    """

    device = torch.device("cpu")

    def __init__(self, path: str | Path, *, n_ctx: int = 4096, threads: int | None = None, n_batch: int = 512,
                 dtype: str | torch.dtype | None = None, tokenizer=None, name: str | None = None,
                 verbose: bool = False):
        path = check_gguf_file(path)
        # checked before llama.cpp sees them: a string reaches ctypes, -1 or 2^31 threads a 16 EiB allocation
        threads = check_threads(torch.get_num_threads() if threads is None else threads)
        n_ctx, n_batch = check_context(n_ctx, n_batch)
        check_gguf_numbers(path)  # numbers llama.cpp asserts on (an abort, not an error) refused by name first
        self.path, self.name = path, name or str(path)
        self.engine = LlamaEngine(path, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=MAX_SEQUENCES,
                                  n_outputs_max=n_batch, threads=threads, verbose=verbose)
        self.threads = threads
        self.architecture = self.engine.meta("general.architecture") or "?"
        self.num_layers, self.hidden_size = self.engine.n_layer, self.engine.n_embd
        self.vocab_size = self.engine.n_vocab
        # a row's positions: the context we made (every row shares its cells), never more than the file trained
        # on; so a prompt + max_new_tokens past it is refused before decoding, not at the full memory
        self.max_positions = min(self.engine.n_ctx_train or self.engine.n_ctx, self.engine.n_ctx)
        softcap = self.engine.meta(f"{self.architecture}.final_logit_softcapping")
        self.softcap: float | None = float(softcap) if softcap else None
        self.dtype = parse_dtype(dtype, "cpu") if dtype else torch.float32
        self._tokenizer = tokenizer
        self._free = set(range(MAX_SEQUENCES))  # sequence ids no open cache holds
        self._embed: nn.Embedding | None = None
        self._head: nn.Linear | None = None
        self._captured: frozenset[int] = frozenset()
        self._config: SimpleNamespace | None = None
        self.engine.clear()

    def close(self) -> None:
        """Free llama.cpp's model and context now; every later call is a named error (`LlamaEngine.handle`)."""
        self.engine.close()

    def __repr__(self) -> str:
        return f"GGUFTarget({self.path.name}, {self.architecture}, {self.num_layers} layers, {self.threads} threads)"

    @property
    def tokenizer(self):
        """The file's own tokenizer as transformers reads a GGUF's (chat template included); None when the file
        carries none it can read (a `none` vocabulary)."""
        if self._tokenizer is None:
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.path.parent, gguf_file=self.path.name)
            except (OSError, ValueError, KeyError, TypeError, NotImplementedError, RuntimeError):
                self._tokenizer = False
            except Exception as err:  # noqa: BLE001 -- tokenizers' bare Exception ('Error while initializing BPE')
                raise ConfigError(f"{self.name}: transformers cannot build a tokenizer from this file's vocabulary "
                                  f"({type(err).__name__}: {err}); its token list is not the byte-level BPE pieces "
                                  "its tokenizer.ggml.model names: the file is corrupt or hand-edited") from None
        return self._tokenizer or None

    @property
    def config(self) -> SimpleNamespace:
        """The decoder's shape from the file's metadata, in transformers' field names (what a fresh drafter
        is shaped by: `checkpoints/dflash.py::new_drafter_config`)."""
        if self._config is None:
            arch, meta = self.architecture, self.engine.meta

            def number(key: str, default=None):
                value = meta(f"{arch}.{key}")
                return default if value is None else float(value) if "." in value or "e" in value else int(value)

            heads = number("attention.head_count")
            self._config = SimpleNamespace(
                num_attention_heads=heads, num_key_value_heads=number("attention.head_count_kv", heads),
                intermediate_size=number("feed_forward_length"),
                head_dim=number("attention.key_length", self.hidden_size // heads if heads else None),
                rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-6),
                rope_parameters={"rope_type": "default", "rope_theta": float(number("rope.freq_base", 10000.0))},
                qkv_bias=read_gguf_tensor(self.path, "blk.0.attn_q.bias", shape_only=True) is not None)
        return self._config

    # --- the surface drafters read ---------------------------------------------------------------
    @property
    def embed_tokens(self) -> nn.Embedding:
        """The token embedding table, dequantised by llama.cpp (`llama_model_get_tok_embd`)."""
        if self._embed is None:
            table = torch.from_numpy(self.engine.token_embeddings()).to(self.dtype)
            self._embed = nn.Embedding.from_pretrained(table, freeze=True)
        return self._embed

    @property
    def input_embedding_scale(self) -> float | None:
        return 1.0 if self.architecture not in ("gemma", "gemma2", "gemma3", "gemma4") else None

    @property
    def lm_head(self) -> nn.Linear:
        """The output projection read from the file (`output.weight`, else the tied embedding table)."""
        if self._head is None:
            weight = read_gguf_tensor(self.path, "output.weight")
            table = torch.from_numpy(weight.copy()) if weight is not None else self.embed_tokens.weight
            head = nn.Linear(table.shape[1], table.shape[0], bias=False)
            head.weight = nn.Parameter(table.to(self.dtype), requires_grad=False)
            self._head = head
        return self._head

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return head_logits(self.lm_head, hidden, self.softcap)

    def eos_token_ids(self) -> list[int]:
        ids = []
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
            value = self.engine.meta(key)
            if value is not None and value.lstrip("-").isdigit() and 0 <= int(value) < self.vocab_size:
                ids.append(int(value))
        return list(dict.fromkeys(ids))

    def check_layer_ids(self, layer_ids: Sequence[int]) -> None:
        validate_layer_ids(tuple(layer_ids), self.num_layers)
        if layer_ids and self.architecture not in CAPTURING_ARCHITECTURES and loaded_engine() != IK_LLAMACPP.name:
            hint = (" Rewrite it as llama.cpp's llama architecture (`blockdraft engines as-llama FILE.gguf`), or run"
                    " it on ik_llama.cpp (BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp), which reads its layers as they are."
                    if self.architecture == "qwen2" else " ik_llama.cpp (BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp) reads"
                    " the layers of most architectures.")
            raise EngineError(f"llama.cpp's {self.architecture!r} graph does not expose its layers' hidden states, "
                              f"which a DFlash drafter reads.{hint} Drafters that read no features (lookup, "
                              "small-AR) run on it as it is")

    def check_batchable(self) -> None:
        """Rows are sequences of one llama.cpp memory: any GGUF decodes several at once on llama.cpp. On
        ik_llama.cpp a pass over rows of different sequences and positions gave other logits than the same rows
        decoded apart (`tests/targets/test_gguf.py::test_rows_decode_together` under
        BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp; a tree's branches within one row do agree), so it decodes one row
        at a time."""
        if loaded_engine() == IK_LLAMACPP.name:
            raise ConfigError(f"{self.name} runs on ik_llama.cpp, which decodes one row at a time here (its passes "
                              "over several rows disagree with the rows decoded apart): decode the prompts one at a "
                              "time, or run batches on llama.cpp (BLOCKDRAFT_GGUF_ENGINE=llama.cpp)")

    # --- rows caches --------------------------------------------------------------------------------
    def open_rows(self, layer_ids: Sequence[int] = ()) -> "GGUFCache":
        """A rows cache in this target's llama.cpp memory (several may be open; they share its cells)."""
        if layer_ids:
            self.check_layer_ids(layer_ids)
        return GGUFCache(self, layer_ids)

    def take_sequences(self, count: int) -> list[int]:
        if count > len(self._free):
            raise EngineError(f"this round needs {count} more llama.cpp sequence ids but {len(self._free)} of "
                              f"{MAX_SEQUENCES} are free (one per row and one per tree node): decode fewer rows at "
                              "once or give trees a smaller budget")
        taken = sorted(self._free)[:count]
        self._free.difference_update(taken)
        return taken

    def give_sequences(self, seqs: Sequence[int]) -> None:
        for seq in seqs:
            self.engine.seq_rm(seq)
        self._free.update(seqs)

    def run(self, tokens: Sequence[int], positions: Sequence[int], sequences: list[list[int]], want: Sequence[bool],
            layer_ids: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray | None]:
        """One llama_decode (at most n_batch tokens): logits (n_wanted, V) in batch order of the wanted entries,
        and the features (n, len(layer_ids) * H) of every entry when layers are asked."""
        lids = frozenset(layer + 1 for layer in layer_ids)
        if lids != self._captured:  # capture exactly what this pass reads: copies cost plain decoding time
            for lid in self._captured - lids:
                self.engine.capture_layer(lid, False)
            for lid in lids - self._captured:
                self.engine.capture_layer(lid, True)
            self._captured = lids
        want = np.asarray(want, dtype=bool)
        self.engine.decode(np.asarray(tokens), np.asarray(positions), sequences, want)
        logits = self.engine.logits(np.nonzero(want)[0]) if want.any() else np.empty((0, self.vocab_size), np.float32)
        features = None
        if layer_ids:
            features = np.concatenate([self.engine.layer(layer + 1, len(tokens)) for layer in layer_ids], axis=1)
        return logits, features

    @torch.no_grad()  # not inference_mode: a drafter's backward may save these tensors (training on GGUF features)
    def features(self, input_ids: torch.Tensor, layer_ids: Sequence[int], *, with_logits: bool = False) -> TargetOutput:
        """Whole-sequence features (1, S, L*H) of `input_ids` (1, S) for training; logits only when asked."""
        self.check_layer_ids(layer_ids)
        cache = GGUFCache(self, layer_ids)
        out = cache.chains(input_ids, torch.tensor([0]), 0 if with_logits else 1)
        cache.close()
        return TargetOutput(logits=out.logits if with_logits else None, features=out.features)


class GGUFCache:
    """The llama.cpp memory of the rows decoding together (`decode/target.py::RowsCache`)."""

    def __init__(self, target: GGUFTarget, layer_ids: Sequence[int] = ()):
        self.target, self.layer_ids = target, tuple(layer_ids)
        self.rows: list[int] = []
        self.seq_of: dict[int, int] = {}  # row -> its sequence id
        self._low: list[int] = []  # the sequences of the low-level passes (`forward`, `chains`)
        self._tree: dict[int, list[int]] = {}  # row -> the node sequences of its last verify pass
        self._finalizer = weakref.finalize(self, _release, target, self.seq_of, self._low, self._tree)

    def close(self) -> None:
        """Give this cache's sequences (and their cells) back now rather than when it is collected."""
        self._finalizer()

    # --- the low-level passes: rows of chains on this cache's own sequences (`forward`, `features`) ------
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, start: int, logits_to_keep: int = 0) -> TargetOutput:
        """Run `input_ids` (1, n) at positions start.. on this cache's first low-level sequence."""
        return self.chains(input_ids, torch.tensor([start]), logits_to_keep)

    def chains(self, input_ids: torch.Tensor, starts: torch.Tensor, logits_to_keep: int = 0) -> TargetOutput:
        """Rows of chains (R, n), row r at starts[r] in this cache's r-th low-level sequence (not its `rows`):
        logits of the last `logits_to_keep` positions (0: all)."""
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ConfigError(f"logits_to_keep must be an integer >= 0, got {logits_to_keep!r}")
        rows, n = input_ids.shape
        seqs = self.low_level_sequences(rows)
        keep = n if logits_to_keep == 0 else min(logits_to_keep, n)
        chains = [([int(t) for t in input_ids[r]], int(starts[r]), [[seqs[r]]] * n) for r in range(rows)]
        logits, features = self.run_rows(chains, [range(n - keep, n)] * rows, self.layer_ids)
        return TargetOutput(logits=logits, features=features)

    # --- batching rows into llama_decode calls -------------------------------------------------------
    def run_rows(self, rows: list[tuple[list[int], int, list[list[int]]]], wanted: list[Sequence[int]],
                 layer_ids: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each row (tokens, start position, per-token sequence lists; positions from `depths` when the row
        gives them as a 4th item) in as few decodes as n_batch allows; returns logits (R, w, V) of the `wanted`
        slots of each row in their order (w the most wanted; zero past a row's own: a prefill keeps one position,
        not the prompt's (S, V)) and features (R, n_max, F) or None."""
        target = self.target
        width = max(len(tokens) for tokens, *_ in rows)
        if (len(rows) == 1 and width <= target.engine.n_batch and list(wanted[0]) == sorted(set(wanted[0]))
                and all(0 <= slot < width for slot in wanted[0])):
            # one row in one decode (every plain step): llama.cpp's logits of the wanted slots, in slot order,
            # are the (1, w, V) answer as they come, with no scatter into a zeroed tensor
            tokens, start, sequences = rows[0][0], rows[0][1], rows[0][2]
            depths = rows[0][3] if len(rows[0]) > 3 else range(len(tokens))
            wanted_slots = set(wanted[0])
            out, feats = target.run(tokens, [start + depth for depth in depths], sequences,
                                    [slot in wanted_slots for slot in range(len(tokens))], layer_ids)
            features = None if feats is None else torch.from_numpy(feats).unsqueeze(0).to(target.dtype)
            return torch.from_numpy(out).unsqueeze(0), features
        column = [{slot: j for j, slot in enumerate(want)} for want in wanted]  # slot -> its logits column
        logits = torch.zeros((len(rows), max(len(c) for c in column), target.vocab_size), dtype=torch.float32)
        features = (torch.zeros((len(rows), width, len(layer_ids) * target.hidden_size), dtype=torch.float32)
                    if layer_ids else None)
        entries = []  # (row, slot, token, position, sequences, want)
        for r, row in enumerate(rows):
            tokens, start, sequences = row[0], row[1], row[2]
            depths = row[3] if len(row) > 3 else range(len(tokens))
            entries += [(r, slot, token, start + depth, seqs, slot in column[r])
                        for slot, (token, depth, seqs) in enumerate(zip(tokens, depths, sequences))]
        step = target.engine.n_batch
        for begin in range(0, len(entries), step):
            chunk = entries[begin:begin + step]
            out, feats = target.run([e[2] for e in chunk], [e[3] for e in chunk], [e[4] for e in chunk],
                                    [e[5] for e in chunk], layer_ids)
            asked = [(e[0], column[e[0]][e[1]]) for e in chunk if e[5]]
            if asked:
                index = torch.tensor(asked)
                logits[index[:, 0], index[:, 1]] = torch.from_numpy(out)
            if features is not None:
                index = torch.tensor([(e[0], e[1]) for e in chunk])
                features[index[:, 0], index[:, 1]] = torch.from_numpy(feats)
        return logits, None if features is None else features.to(target.dtype)

    def low_level_sequences(self, rows: int) -> list[int]:
        if len(self._low) < rows:
            self._low += self.target.take_sequences(rows - len(self._low))
        return self._low[:rows]

    # --- the loop's rows cache (decode/target.py::RowsCache) ------------------------------------------
    def prefill(self, rows: list[int], prompts: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """Run the prompts of `rows` and append them as rows: their last-position logits (R, V) and each one's
        prompt features (1, n_r, F) or None."""
        seqs = self.target.take_sequences(len(rows))
        chains = []
        for row, seq, prompt in zip(rows, seqs, prompts):
            self.seq_of[row] = seq
            tokens = prompt[0].tolist()
            chains.append((tokens, 0, [[seq]] * len(tokens)))
        logits, features = self.run_rows(chains, [[len(t) - 1] for t, *_ in chains], self.layer_ids)
        self.rows = self.rows + list(rows)
        return (logits[:, 0],
                [None if features is None else features[i:i + 1, :len(t)] for i, (t, *_) in enumerate(chains)])

    def verify(self, anchors: list[torch.Tensor], starts: list[int], proposals: list[Proposal]) -> TargetOutput:
        """One pass over every row's [anchor, proposal]: logits (R, n, V), features (R, n, F) (rows shorter than
        the longest are zero past their end: never read). A pass refused or failed midway (too few sequence ids,
        a full memory) gives back every tree node's sequence it took before the error is raised."""
        try:
            return self._verify(anchors, starts, proposals)
        except BaseException:
            nodes = [seq for row_nodes in self._tree.values() for seq in row_nodes]
            self._tree.clear()
            self.target.give_sequences(nodes)
            raise

    def _verify(self, anchors: list[torch.Tensor], starts: list[int], proposals: list[Proposal]) -> TargetOutput:
        rows = []
        for row, anchor, start, proposal in zip(self.rows, anchors, starts, proposals):
            seq = self.seq_of[row]
            tokens = [int(anchor.reshape(-1)[0])] + proposal.tokens.tolist()
            tree = proposal.tree_parents()
            if tree is None:
                rows.append((tokens, start, [[seq]] * len(tokens)))
                continue
            parents = tree.tolist()
            nodes = self.target.take_sequences(len(parents))
            self._tree[row] = nodes
            for node_seq in nodes:  # every node sees the row's past
                self.target.engine.seq_cp(seq, node_seq, 0, start)
            depth, below = [], [[i] for i in range(len(parents))]  # below[i]: node i and its descendants
            for i, parent in enumerate(parents):
                depth.append(1 if parent < 0 else depth[parent] + 1)
            for i in reversed(range(len(parents))):
                if parents[i] >= 0:
                    below[parents[i]] += below[i]
            sequences = [[seq] + nodes] + [[nodes[j] for j in below[i]] for i in range(len(parents))]
            rows.append((tokens, start, sequences, [0] + depth))
        logits, features = self.run_rows(rows, [range(len(r[0])) for r in rows], self.layer_ids)
        return TargetOutput(logits=logits, features=features)

    def keep(self, still: list[int], starts: list[int], kept: list[int], paths: list[list[int]], width: int) -> None:
        """After `verify`: each row of `still` keeps its past and the first `kept` of [anchor, its accepted
        path]; other rows leave. `starts`, `kept`, `paths` follow `self.rows`."""
        engine, staying = self.target.engine, set(still)
        for index, row in enumerate(self.rows):
            seq, start, count = self.seq_of[row], starts[index], kept[index]
            nodes = self._tree.pop(row, None)
            if row not in staying:
                if nodes:
                    self.target.give_sequences(nodes)
                self.target.give_sequences([self.seq_of.pop(row)])
                continue
            if nodes is None:
                engine.seq_rm(seq, start + count, -1)
                continue
            engine.seq_rm(seq, start + 1, -1)  # a tree row's own sequence holds only its anchor in the pass
            if count > 1:  # the path's cells: those of the deepest kept node's sequence past the anchor
                engine.seq_cp(nodes[paths[index][count - 2]], seq, start + 1, start + count)
            self.target.give_sequences(nodes)
        self.rows = [row for row in self.rows if row in staying]

    def drop(self, still: list[int], starts: list[int]) -> None:
        """Rows not in `still` leave; the others keep their first `starts` positions (rows done at prefill)."""
        staying = set(still)
        for row, start in zip(self.rows, starts):
            if row in staying:
                self.target.engine.seq_rm(self.seq_of[row], start, -1)
            else:
                self.target.give_sequences([self.seq_of.pop(row)])
        self.rows = [row for row in self.rows if row in staying]

    def crop(self, length: int) -> None:
        """Every sequence of this cache keeps its first `length` positions."""
        for seq in list(self.seq_of.values()) + self._low:
            self.target.engine.seq_rm(seq, length, -1)


def _release(target: GGUFTarget, seq_of: dict, low: list, tree: dict) -> None:
    """A cache that is gone gives its sequences back (and their cells): rows', low-level passes' and the tree
    nodes' of a round that never reached `keep` (one refused or failed midway)."""
    seqs = list(seq_of.values()) + list(low) + [seq for nodes in tree.values() for seq in nodes]
    seq_of.clear(), low.clear(), tree.clear()
    target._free.update(seqs)  # ours again even when the engine is closed or gone
    try:
        for seq in seqs:
            target.engine.seq_rm(seq)
    except Exception:  # noqa: BLE001 -- a closed target, or interpreter shutdown: no cells left to free
        pass


def read_gguf_tensor(path: Path, name: str, *, shape_only: bool = False) -> np.ndarray | tuple | None:
    """Tensor `name` of a GGUF as float32 (rows, cols), dequantised by the gguf package (or only its shape);
    None when absent."""
    from gguf.quants import dequantize  # deferred: `import blockdraft` must not load the gguf package

    reader = open_gguf(path)
    for tensor in reader.tensors:
        if tensor.name == name:
            if shape_only:
                return tuple(int(d) for d in tensor.shape)
            values = dequantize(tensor.data, tensor.tensor_type)
            rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
            return np.ascontiguousarray(values.reshape(rows, -1), dtype=np.float32)
    return None
