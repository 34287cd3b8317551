"""The reliability probe's GGUF cases (issue 41 item 3): derived files keyed by content, bounded templates and
metadata, named errors for a file's numbers and for misuse of the GGUF target's API. Each test fails on the
code before its fix (the fault it names is described in its docstring)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.engines.test_gguf_arch import read, write_qwen2_gguf


# --- silent wrong output: derived GGUF files keyed by content, not by name and mtime --------------------------
def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_replaced_qwen2_file_gets_its_own_llama_copy(tmp_path, monkeypatch):
    """Before: the copy `<stem>-as-llama.gguf` was reused while its mtime was not older than the source's, so a
    file replaced by another model with an older mtime (`cp -p`) decoded with the old model's weights."""
    from blockdraft.engines import derived, llamacpp_cache

    monkeypatch.setattr(llamacpp_cache, "engine_root", lambda: tmp_path / "engine")
    source = tmp_path / "model.gguf"
    write_qwen2_gguf(source)
    first = llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True)
    other = tmp_path / "other" / "model.gguf"
    other.parent.mkdir()
    shutil.copy(source, other)
    _flip_last_byte(other)  # another model: one quantized weight differs
    os.utime(other, ns=(10**18, 10**18))
    shutil.copy2(other, source)  # replaced, keeping an mtime older than the copy's
    assert source.stat().st_mtime < first.stat().st_mtime
    second = llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True)
    assert second != first
    k_first, k_second = read(first)[1]["blk.0.attn_k.weight"][0], read(second)[1]["blk.0.attn_k.weight"][0]
    assert not np.array_equal(k_first, k_second)  # the new copy holds the new weights
    # the same file again: the copy is reused and the source is not hashed again (the sidecar remembers it)
    hashed = []
    monkeypatch.setattr(derived, "file_sha256", lambda path: hashed.append(path) or "0" * 64)
    assert llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True) == second
    assert hashed == []
    os.utime(source, ns=(10**18 + 5, 10**18 + 5))  # touched: hashed again (here to a fake digest)
    llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True)
    assert hashed == [source.resolve()]


def test_a_converted_hf_target_is_named_by_its_folders_content(tmp_path, monkeypatch):
    """Before: `<name>-f32.gguf` was named by the folder's name, so another model under the same name (or its
    weights replaced) reused the first one's conversion."""
    from blockdraft.engines import gguf_files

    monkeypatch.setattr(gguf_files, "engine_root", lambda: tmp_path / "engine")
    folder = tmp_path / "a" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"one")
    first = gguf_files.target_gguf_path(str(folder), "f32")
    assert gguf_files.target_gguf_path(str(folder), "f32") == first
    other = tmp_path / "b" / "tiny"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"two")
    assert gguf_files.target_gguf_path(str(other), "f32") != first
    assert gguf_files.target_gguf_path(str(other), "f32").name.startswith("tiny-")


# --- numbers llama.cpp asserts on, and metadata bombs: refused by name before llama.cpp or gguf-py read them -----
def write_meta_gguf(path: Path, **metadata) -> Path:
    """A GGUF with qwen3 metadata (and no tensors: the checks run before llama.cpp loads anything); keyword
    arguments replace values (`block_count=0`) or add arrays (`bomb=[...]`)."""
    import gguf

    values = {"block_count": 2, "context_length": 64, "embedding_length": 8, "attention.head_count": 2,
              "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6, **metadata}
    writer = gguf.GGUFWriter(str(path), "qwen3")
    for key, value in values.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float32(f"qwen3.{key}", value)
        elif key.startswith("tokenizer."):
            writer.add_uint32(key, value)
        else:
            writer.add_uint32(f"qwen3.{key}", value)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(16)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("change, message", [
    ({"block_count": 0}, "block_count is 0"),
    ({"block_count": 600}, "block_count is 600"),
    ({"attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon is nan"),
    ({"attention.layer_norm_rms_epsilon": -1e-6}, "must be finite and >= 0"),
    ({"rope.freq_base": 0.0}, "rope.freq_base is 0.0"),
    ({"tokenizer.ggml.eos_token_id": 10**6}, "past its vocabulary of 16 tokens"),
])
def test_numbers_llama_cpp_aborts_on_are_refused_by_name(tmp_path, change, message):
    """Before: llama.cpp's GGML_ASSERT aborted the process (SIGABRT) on block_count 0/huge and a NaN or negative
    epsilon; an EOS id past the vocabulary was an IndexError in the tokenizer."""
    from blockdraft.engines.llamacpp import EngineError
    from blockdraft.targets import gguf as gguf_target

    path = write_meta_gguf(tmp_path / "bad.gguf", **change)
    with pytest.raises(EngineError, match=message):
        gguf_target.load(path)
    good = write_meta_gguf(tmp_path / "good.gguf")  # negative control: the same file unchanged passes the checks
    from blockdraft.engines.gguf_header import check_gguf_numbers
    assert check_gguf_numbers(good).metadata["qwen3.block_count"] == 2


def test_a_metadata_array_bomb_is_refused_fast(tmp_path):
    """Before: 2,000,000 empty strings in an unused array (16 MB) took 72 s and 3.5 GiB to load (gguf-py builds
    numpy objects per item); now refused by its count, before a single item is read."""
    import time

    from blockdraft.engines.gguf_files import gguf_architecture
    from blockdraft.engines.gguf_header import MAX_ARRAY, read_gguf_header
    from blockdraft.engines.llamacpp import EngineError

    path = tmp_path / "bomb.gguf"
    with open(write_meta_gguf(path), "rb") as stream:
        data = stream.read()
    # splice a string array of 2,000,000 empty strings in as the file's last metadata entry (by hand: gguf's writer
    # would take minutes to build it)
    count_at = 4 + 4 + 8  # magic, version, tensor count -> the metadata count
    keys = int.from_bytes(data[count_at:count_at + 8], "little")
    key = b"general.unused"

    def strings(count: int) -> bytes:
        return (len(key).to_bytes(8, "little") + key + (9).to_bytes(4, "little") + (8).to_bytes(4, "little")
                + count.to_bytes(8, "little") + bytes(8) * count)

    bomb = strings(2_000_000)
    header = read_gguf_header(path)
    assert header.tensor_count == 0
    end = header.end  # no tensors: the bomb goes where the metadata ends
    spliced = data[:count_at] + (keys + 1).to_bytes(8, "little") + data[count_at + 8:end] + bomb
    small = tmp_path / "small.gguf"  # negative control: the same splice with 1,000 strings reads (and counts them)
    small.write_bytes(data[:count_at] + (keys + 1).to_bytes(8, "little") + data[count_at + 8:end] + strings(1000))
    assert read_gguf_header(small).arrays["general.unused"] == (8, 1000)
    path.write_bytes(spliced)
    started = time.perf_counter()
    with pytest.raises(EngineError, match="2,000,000 items"):
        gguf_architecture(path)
    assert time.perf_counter() - started < 2.0
    assert MAX_ARRAY < 2_000_000
    path.write_bytes(data[:count_at] + (keys + 1).to_bytes(8, "little") + data[count_at + 8:end] + strings(100_000))
    with pytest.raises(EngineError, match="100,000 items"):  # an unused key is held to per-layer sizes
        read_gguf_header(path)


# --- the Python API's numbers, and a target used after close() ----------------------------------------------
@pytest.mark.parametrize("options", [{"threads": -1}, {"threads": 10**6}, {"threads": 2**31}, {"threads": "2"},
                                     {"threads": 2.5}, {"threads": True}, {"n_ctx": 2**40}, {"n_ctx": "4096"},
                                     {"n_ctx": 17.5}, {"n_ctx": 8}])
def test_threads_and_n_ctx_are_checked_before_llama_cpp(tmp_path, options):
    """Before: threads -1 or 2^31 asked ggml for 16 EiB (SIGSEGV), 10^6 aborted (bad_alloc), a string or float
    reached ctypes (ArgumentError), n_ctx 2^40 was truncated to 0 and silently replaced by the file's."""
    from blockdraft.engines.llamacpp import EngineError
    from blockdraft.targets.gguf import GGUFTarget

    path = write_meta_gguf(tmp_path / "t.gguf")
    with pytest.raises(EngineError, match="threads|n_ctx"):
        GGUFTarget(path, **options)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from gguf_models import require_llamacpp, write_tiny_gguf
    from helpers import tiny_target

    require_llamacpp()
    return write_tiny_gguf(tiny_target("qwen3").model, tmp_path_factory.mktemp("g") / "t.gguf")


def test_a_closed_target_is_a_named_error_not_a_segfault(tiny_gguf):
    """Before: a call after `engine.close()` handed llama.cpp a NULL context (SIGSEGV)."""
    import torch

    import blockdraft
    from blockdraft.engines.llamacpp import EngineError

    target = blockdraft.load_target(tiny_gguf, threads=1)
    cache = target.open_rows()
    assert cache.forward(torch.tensor([[1, 2, 3]]), 0, logits_to_keep=1).logits.shape[-1] == target.vocab_size
    target.close()
    with pytest.raises(EngineError, match="closed"):
        cache.forward(torch.tensor([[4]]), 3, logits_to_keep=1)
    with pytest.raises(EngineError, match="closed"):
        target.engine.set_threads(1)
    target.close()  # twice is fine
    cache.close()  # giving sequences back to a closed target is not an error either


def test_context_length_reads_unsigned_and_max_positions_is_the_context(tiny_gguf, tmp_path):
    """Before: a context_length of 2^32-1 read back as -1 (every prompt refused: 'the target supports -1'), and
    max_positions was the file's context_length, so 4,200 new tokens on a 4,096-cell context failed only after
    ~4,090 were decoded."""
    import gguf

    import blockdraft
    from blockdraft.config import ConfigError

    reader = gguf.GGUFReader(str(tiny_gguf))
    field = reader.fields["qwen3.context_length"]
    huge = tmp_path / "ctx.gguf"
    data = bytearray(tiny_gguf.read_bytes())
    offset = int(field.parts[-1].ctypes.data - reader.data.ctypes.data)
    data[offset:offset + 4] = (2**32 - 1).to_bytes(4, "little")
    huge.write_bytes(bytes(data))
    target = blockdraft.load_target(huge, threads=1, n_ctx=256)
    assert target.engine.n_ctx_train == 2**32 - 1
    assert target.max_positions == 256
    import torch
    with pytest.raises(ConfigError, match="needs 303 positions but the target supports 256"):
        blockdraft.generate(target, None, torch.tensor([[1, 2, 3]]), max_new_tokens=300)
    target.close()


# --- chat templates from model files: bounded, and their refusals named ----------------------------------------
@pytest.fixture()
def chat_tokenizer(tmp_path):
    from chat_fixtures import save_tiny_chat_folder
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_tiny_chat_folder(tmp_path / "tok"))


@pytest.mark.parametrize("template, message", [
    ("{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}", "more than 2,000,000|ran over"),
    ("{{ 'x' * 10**8 }}", "more than 2,000,000"),
    ("{{ ''.__class__.__mro__ }}", "refused by jinja2's sandbox"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ raise_exception('template says no') }}", "template says no"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "ran over"),
])
def test_a_hostile_chat_template_is_a_named_error(chat_tokenizer, monkeypatch, template, message):
    """Before: the loop grew one string until memory ran out (MemoryError / OOM killer), 'x' * 10**9 aborted
    tokenizers on allocation (SIGABRT), and the sandbox's SecurityError, a RecursionError or the template's
    own raise_exception were raw tracebacks."""
    from blockdraft.data import chat

    monkeypatch.setattr(chat, "MAX_SECONDS", 1.0)
    messages = [{"role": "user", "content": "hi"}]
    assert "hi" in chat.chat_text(chat_tokenizer, messages)  # negative control: the fixture's own template renders
    chat_tokenizer.chat_template = template
    for render in (chat.chat_text, chat.chat_ids):
        with pytest.raises(chat.TemplateError, match=message):
            render(chat_tokenizer, messages)


def test_a_tokenizer_panic_is_a_named_cli_error(monkeypatch, capsys):
    """Before: a backtracking pre-tokenizer regex surfaced as a raw pyo3_runtime.PanicException traceback (a
    BaseException, which no `except Exception` catches)."""
    from blockdraft import cli

    PanicException = type("PanicException", (BaseException,), {})

    def panics(args):
        raise PanicException("Onig: Regex search error: retry-limit-in-match over")

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), panics))
    assert cli.main(["engines", "status", "llama.cpp"]) == 2
    assert "the tokenizer failed inside its Rust library" in capsys.readouterr().err


def _with_func(parser, func):
    parse = parser.parse_known_args

    def parse_known_args(argv=None):
        args, extra = parse(argv)
        args.func = func
        return args, extra

    parser.parse_known_args = parse_known_args
    return parser


# --- transformers-only options on a GGUF target: refused up front by name ---------------------------------------
def test_transformers_only_methods_and_options_refuse_a_gguf_target(tiny_gguf):
    """Before: `hf-assisted` / `hf-prompt-lookup` in bench and `init_drafter(from_target_layers=True)` on a GGUF
    target were AttributeError 'GGUFTarget' object has no attribute 'model' (bench: after results.json)."""
    import blockdraft
    from blockdraft.checkpoints.dflash import init_drafter
    from blockdraft.config import ConfigError, SamplingConfig
    from blockdraft.eval.methods import build_runners

    target = blockdraft.load_target(tiny_gguf, threads=1)
    for method in ("hf-prompt-lookup", "hf-assisted:somewhere"):
        with pytest.raises(ConfigError, match="needs a Hugging Face target"):
            build_runners(["ar", method], None, target, SamplingConfig())
    runners, _ = build_runners(["ar"], None, target, SamplingConfig())  # negative control: our loop's methods run
    assert len(runners) == 1
    with pytest.raises(ConfigError, match="from_target_layers copies a transformers target"):
        init_drafter(target, from_target_layers=True, target_layer_ids=[0])
    assert init_drafter(target, target_layer_ids=[0]) is not None
    target.close()


def test_a_file_whose_vocabulary_transformers_cannot_build_is_named(tiny_gguf, monkeypatch):
    """Before: tokenizers' bare Exception ('Error while initializing BPE: Token `Ġ` out of vocabulary') escaped
    GGUFTarget.tokenizer as a traceback."""
    import blockdraft
    from blockdraft.config import ConfigError
    from blockdraft.targets import gguf as gguf_target

    target = blockdraft.load_target(tiny_gguf, threads=1)

    def broken(*args, **kwargs):
        raise Exception("Error while initializing BPE: Token `Ġ` out of vocabulary")  # noqa: TRY002 -- as tokenizers

    monkeypatch.setattr(gguf_target.AutoTokenizer, "from_pretrained", broken)
    with pytest.raises(ConfigError, match="cannot build a tokenizer from this file's vocabulary"):
        target.tokenizer
    target.close()


def test_a_round_refused_for_sequence_ids_gives_them_back(tiny_gguf):
    """Before: the tree nodes' sequence ids taken for earlier rows of a refused round stayed taken (~200 of 256),
    so the next batch in the same process failed."""
    import torch

    import blockdraft
    from blockdraft.decode.proposal import Proposal
    from blockdraft.engines.llamacpp import EngineError
    from blockdraft.targets.llama_lib import MAX_SEQUENCES

    target = blockdraft.load_target(tiny_gguf, threads=1, n_ctx=1024)
    cache = target.open_rows()
    cache.prefill([0, 1], [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])])
    cache.drop([0, 1], [2, 1])  # as the loop does: the last prompt token comes back as the round's anchor
    assert len(target._free) == MAX_SEQUENCES - 2

    def star(nodes: int) -> Proposal:  # a tree of `nodes` siblings under the anchor
        return Proposal(tokens=torch.arange(nodes) % 7, parents=torch.full((nodes,), -1))

    with pytest.raises(EngineError, match="sequence ids"):
        cache.verify([torch.tensor([[3]]), torch.tensor([[5]])], [2, 1], [star(200), star(100)])
    assert len(target._free) == MAX_SEQUENCES - 2  # every node's id is back; the rows keep theirs
    out = cache.verify([torch.tensor([[3]]), torch.tensor([[5]])], [2, 1], [star(100), star(100)])  # fits now
    assert out.logits.shape[:2] == (2, 101)
    cache.keep([], [2, 1], [1, 1], [[], []], 101)
    cache.close()
    assert len(target._free) == MAX_SEQUENCES
    target.close()


def test_generate_takes_n_ctx_and_the_advice_names_it(tiny_gguf, capsys):
    """Before: the advice on a context too small named `n_ctx=...`, which `generate` did not take."""
    from blockdraft.cli import main

    assert main(["generate", "--target", str(tiny_gguf), "--prompt", "w1", "--n-ctx", "8", "--threads", "1"]) == 2
    assert "n_ctx (the GGUF target's context positions) must be a whole number in [16" in capsys.readouterr().err
    import blockdraft.decode.loop as loop
    import inspect
    assert "--n-ctx" in inspect.getsource(loop._check_request)


def test_a_truncated_library_is_named_not_a_sigbus(tmp_path):
    """Before: a libllama.so cut short after the shim was compiled killed the process with SIGBUS as the loader
    mapped it; now it is loaded once in a child process first (`prove_loadable`)."""
    from gguf_models import require_llamacpp

    from blockdraft.engines.llamacpp import EngineError
    from blockdraft.targets.llama_lib import PROOF_SUFFIX, _libllama, prove_loadable

    libllama = _libllama(require_llamacpp()).resolve()
    whole = tmp_path / "libwhole.so"
    shutil.copy(libllama, whole)
    prove_loadable(whole, [whole])  # negative control: the intact copy loads, and the proof is kept
    assert (tmp_path / ("libwhole.so" + PROOF_SUFFIX)).is_file()
    cut = tmp_path / "libcut.so"
    cut.write_bytes(libllama.read_bytes()[: libllama.stat().st_size // 2])
    with pytest.raises(EngineError, match="do not load"):
        prove_loadable(cut, [cut])
    whole.write_bytes(cut.read_bytes())  # the proven library cut afterwards: its stamp changed, proved again
    with pytest.raises(EngineError, match="do not load"):
        prove_loadable(whole, [whole])


def test_bench_takes_n_ctx_and_keeps_older_results_compatible():
    """bench had no way to give a GGUF target more context; a run without --n-ctx keeps the identity it had."""
    from blockdraft.cli import build_parser
    from blockdraft.eval.bench import BenchConfig

    args = build_parser().parse_args(["bench", "--target", "t.gguf", "--method", "ar", "--dataset", "humaneval",
                                      "--out", "o", "--n-ctx", "8192"])
    assert args.n_ctx == 8192
    plain = BenchConfig(target="t", methods=("ar",), datasets=("humaneval",))
    assert "n_ctx" not in plain.identity()
    assert BenchConfig(target="t", methods=("ar",), datasets=("humaneval",), n_ctx=8192).identity()["n_ctx"] == 8192


def test_an_exported_draft_gguf_is_keyed_by_the_targets_content(tmp_path, monkeypatch):
    """Before: the bench's cached draft GGUF (which carries the target's LM-head rows) was keyed by the target's
    name, so another model under the same name reused the old rows."""
    from blockdraft.export import gguf as export_gguf

    monkeypatch.setattr(export_gguf, "engine_root", lambda: tmp_path / "engine")
    made = []

    def export(folder, target_name, path, **options):
        made.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")
        path.with_name(path.name + ".json").write_text("{}")  # the facts sidecar the real export writes
        return path, {"target": target_name}

    monkeypatch.setattr(export_gguf, "export_drafter_gguf", export)
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    (drafter / "model.safetensors").write_bytes(b"d")
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"one")
    first = export_gguf.draft_gguf(str(drafter), str(target), False)[0]
    assert export_gguf.draft_gguf(str(drafter), str(target), False)[0] == first and len(made) == 1
    (target / "model.safetensors").write_bytes(b"two!")  # another model under the same name
    assert export_gguf.draft_gguf(str(drafter), str(target), False)[0] != first and len(made) == 2
