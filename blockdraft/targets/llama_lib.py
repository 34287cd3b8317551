"""llama.cpp's C API in Python: the shim (`llama_shim.c`) compiled against the verified build, bound by ctypes.

The shim is compiled once per build and per shim source (its sha256 names the library), beside the
build's own `libllama`, with the machine's C compiler: about a second. `LlamaEngine` is one model and one
context; `targets/gguf.py` builds the target protocol on it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from ..engines.llamacpp import EngineError, LlamaCppBuild, find_llamacpp, gguf_engine
from ..files import write_json_atomic

SHIM_SOURCE = Path(__file__).with_name("llama_shim.cpp")  # llama.cpp's; each engine names its own (`EngineSource.shim`)
#: llama.cpp keeps at most this many sequence ids (LLAMA_MAX_SEQ in its llama-cparams.h)
MAX_SEQUENCES = 256

_i32, _p = ctypes.c_int32, ctypes.c_void_p
_SIGNATURES = {  # name: (argument types, result type)
    "bd_set_quiet": ([_i32], None),
    "bd_open": ([ctypes.c_char_p, _i32, _i32, _i32, _i32, _i32], _p),
    "bd_close": ([_p], None),
    "bd_n_vocab": ([_p], _i32), "bd_n_embd": ([_p], _i32), "bd_n_layer": ([_p], _i32),
    "bd_n_ctx_train": ([_p], _i32), "bd_n_ctx": ([_p], _i32), "bd_is_eog": ([_p, _i32], _i32),
    "bd_meta": ([_p, ctypes.c_char_p, ctypes.c_char_p, _i32], _i32),
    "bd_tok_embd": ([_p, _p], ctypes.c_uint32),
    "bd_capture_layer": ([_p, _i32, _i32], None),
    "bd_set_threads": ([_p, _i32], None),
    "bd_decode": ([_p, _i32, _p, _p, _p, _p, _i32, _p], _i32),
    "bd_logits": ([_p, _i32, _p, _p], _i32),
    "bd_layer": ([_p, _i32, _i32, _p], _i32),
    "bd_seq_rm": ([_p, _i32, _i32, _i32], _i32),
    "bd_seq_cp": ([_p, _i32, _i32, _i32, _i32], None),
    "bd_seq_pos_max": ([_p, _i32], _i32),
    "bd_clear": ([_p], None),
}


def _libllama(build: LlamaCppBuild) -> Path:
    for folder in (build.bin_dir, build.bin_dir.parent / "src"):
        if (folder / "libllama.so").is_file():
            return folder / "libllama.so"
    raise EngineError(f"the llama.cpp build in {build.release} has no libllama.so (a static build?): run "
                      "`blockdraft engines build llama.cpp --force`")


def shim_source(build: LlamaCppBuild) -> Path:
    return Path(__file__).with_name(build.source.shim)


SHIM_HEADER = Path(__file__).with_name("shim_batch.h")  # what both shims share, part of each one's hash


def shim_path(build: LlamaCppBuild) -> Path:
    source = shim_source(build)
    digest = hashlib.sha256(source.read_bytes() + SHIM_HEADER.read_bytes()).hexdigest()[:12]
    return build.bin_dir / f"libblockdraft_{source.stem}-{digest}.so"


def compile_shim(build: LlamaCppBuild) -> Path:
    """The shim library for `build`, compiled when missing (written under a temporary name, then renamed)."""
    out = shim_path(build)
    if out.is_file():
        return out
    libllama = _libllama(build)
    compiler = next((c for c in (os.environ.get("CXX") or "c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None:
        raise EngineError("a GGUF target needs a C++ compiler to build blockdraft's llama.cpp shim: apt-get install "
                          "build-essential (or set CXX)")
    partial = out.with_name(out.name + f".{os.getpid()}.partial")
    command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", str(shim_source(build)), "-o", str(partial),
               f"-I{build.tree / 'include'}", f"-I{build.tree / 'ggml' / 'include'}",
               f"-L{libllama.parent}", "-lllama", f"-Wl,-rpath,{libllama.parent}"]
    # the thread-pool functions live in ggml's CPU library; linked by name where the build has one (a build that
    # loads its CPU backends at run time has none: libllama's own dependencies resolve them when it loads)
    # (ik_llama.cpp keeps one libggml, in its own folder: the shim calls its row converters directly)
    for name in ("ggml-cpu", "ggml-base", "ggml"):
        found = next((folder for folder in (libllama.parent, build.bin_dir.parent / "ggml" / "src")
                      if (folder / f"lib{name}.so").exists()), None)
        if found is not None:
            command += [f"-L{found}", f"-l{name}", f"-Wl,-rpath,{found}"]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise EngineError(f"compiling blockdraft's llama.cpp shim failed (exit {done.returncode}):\n"
                          + "\n".join(done.stdout.splitlines()[-15:]))
    os.replace(partial, out)
    return out


_LIB: tuple[str, ctypes.CDLL] | None = None  # (engine name, its bound shim)
PROOF_SUFFIX = ".loaded.json"


def prove_loadable(shim: Path, libraries: list[Path]) -> None:
    """Load `shim` once in a child process before this one maps it: a library cut short after the build (a
    full disk, an interrupted copy) is a SIGBUS inside the dynamic loader, which no Python code can catch, so
    it kills the child, not us. The proof is kept beside the shim with the (name, size, mtime_ns, inode) of
    every library it loaded, and redone whenever one of them changes."""
    stamp = [[path.name, *(lambda st: (st.st_size, st.st_mtime_ns, st.st_ino))(path.stat())] for path in libraries]
    proof = shim.with_name(shim.name + PROOF_SUFFIX)
    try:
        if json.loads(proof.read_text()) == stamp:
            return
    except (OSError, ValueError):
        pass
    done = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(shim)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if done.returncode != 0:
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit {done.returncode}: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ''}")
        raise EngineError(f"the llama.cpp libraries of {shim.parent} do not load ({how}): one is cut short or "
                          "damaged (a full disk, an interrupted copy); run `blockdraft engines build llama.cpp "
                          "--force` (nothing was loaded into this process)")
    try:
        write_json_atomic(proof, stamp)
    except Exception:  # noqa: BLE001 -- a read-only build folder: proved for this process, proved again next time
        pass


def library(build: LlamaCppBuild | None = None) -> ctypes.CDLL:
    """The bound shim of the verified build of the chosen engine (`engines.llamacpp.gguf_engine`), one per
    process: llama.cpp's and ik_llama.cpp's libraries are both `libllama.so`, and the loader would resolve the
    second engine's shim against the first's library, so a process runs one engine."""
    global _LIB
    if build is None and _LIB is not None:
        return _LIB[1]
    build = build or find_llamacpp(gguf_engine())
    if _LIB is not None and _LIB[0] != build.source.name:
        raise EngineError(f"this process already runs GGUF targets on {_LIB[0]}; {build.source.name} cannot load "
                          "beside it (both libraries are libllama): run it in another process "
                          "(BLOCKDRAFT_GGUF_ENGINE=... picks the engine)")
    if _LIB is None:
        shim = compile_shim(build)
        libraries = {shim, *(path for folder in {_libllama(build).parent, build.bin_dir}
                             for path in folder.glob("lib*.so*") if path.is_file() and not path.is_symlink())}
        prove_loadable(shim, sorted(libraries))
        try:
            lib = ctypes.CDLL(str(shim))
        except OSError as err:  # not a library this machine loads (another ELF class, a cut file)
            raise EngineError(f"blockdraft's llama.cpp shim {shim} does not load ({err}): delete it and run "
                              f"`blockdraft engines build {build.source.name} --force`") from None
        for name, (args, result) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = args, result
        _LIB = (build.source.name, lib)
    return _LIB[1]


def loaded_engine() -> str | None:
    """The engine whose library this process loaded, None before the first GGUF target."""
    return None if _LIB is None else _LIB[0]


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


MAX_THREADS = 1024  # ggml sizes its worker pool by the count: -1 or 2^31 ask for 16 EiB (SIGSEGV)
MAX_CTX = 1 << 24  # positions; llama.cpp takes a uint32, and ctypes would wrap anything past int32 silently


def _whole(value, name: str, low: int, high: int) -> int:
    """`value` when it is an int (not a bool, a float or a string: ctypes would refuse or truncate it) in
    [low, high]; a named error otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= int(value) <= high:
        raise EngineError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
    return int(value)


def check_threads(threads) -> int:
    return _whole(threads, "threads (llama.cpp's CPU threads)", 1, MAX_THREADS)


def check_context(n_ctx, n_batch) -> tuple[int, int]:
    return (_whole(n_ctx, "n_ctx (the GGUF target's context positions)", 16, MAX_CTX),
            _whole(n_batch, "n_batch (tokens per llama_decode)", 1, MAX_CTX))


class LlamaEngine:
    """One GGUF model and one llama.cpp context on the CPU: decode batches with positions and sequence ids,
    read logits and captured layer inputs back, edit the memory by sequence."""

    def __init__(self, path: str | Path, *, n_ctx: int, n_batch: int, n_seq_max: int, n_outputs_max: int,
                 threads: int, verbose: bool = False):
        threads = check_threads(threads)
        n_ctx, n_batch = check_context(n_ctx, n_batch)
        n_outputs_max = _whole(n_outputs_max, "n_outputs_max", 1, MAX_CTX)
        self.lib = library()
        self.lib.bd_set_quiet(0 if verbose else 1)
        if not 1 <= n_seq_max <= MAX_SEQUENCES:
            raise EngineError(f"n_seq_max must lie in [1, {MAX_SEQUENCES}] (llama.cpp's limit), got {n_seq_max}")
        handle = self.lib.bd_open(str(path).encode(), n_ctx, n_batch, n_seq_max, n_outputs_max, threads)
        if not handle:
            raise EngineError(f"llama.cpp could not load {path} or make a context of {n_ctx} positions for it (its "
                              "log above says why): is it a GGUF of a decoder model, and is there memory for it?")
        self._handle, self.n_batch, self.n_seq_max = handle, n_batch, n_seq_max
        self.n_vocab = self.lib.bd_n_vocab(handle)
        self.n_embd = self.lib.bd_n_embd(handle)
        self.n_layer = self.lib.bd_n_layer(handle)
        # llama.cpp keeps the file's context_length as a uint32 but returns it as an int32: 2^32-1 reads as -1
        self.n_ctx_train = self.lib.bd_n_ctx_train(handle) & 0xFFFFFFFF
        self.n_ctx = self.lib.bd_n_ctx(handle)

    @property
    def handle(self) -> int:
        """The open context; a named error once closed (llama.cpp would be handed a NULL pointer: SIGSEGV)."""
        if not self._handle:
            raise EngineError("this GGUF target is closed: load it again (every call after close() is refused)")
        return self._handle

    @property
    def closed(self) -> bool:
        return not getattr(self, "_handle", None)

    def close(self) -> None:
        if not self.closed:
            handle, self._handle = self._handle, None
            self.lib.bd_close(handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown: the library may be gone already
            pass

    def meta(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(4096)
        size = self.lib.bd_meta(self.handle, key.encode(), buffer, len(buffer))
        return None if size < 0 else buffer.value.decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(self.lib.bd_is_eog(self.handle, token))

    def token_embeddings(self) -> np.ndarray:
        out = np.empty((self.n_vocab, self.n_embd), dtype=np.float32)
        if self.lib.bd_tok_embd(self.handle, _ptr(out)) != out.size:
            raise EngineError("llama.cpp could not give this model's token embedding table")
        return out

    def capture_layer(self, lid: int, on: bool = True) -> None:
        self.lib.bd_capture_layer(self.handle, lid, int(on))

    def set_threads(self, threads: int) -> None:
        self.lib.bd_set_threads(self.handle, check_threads(threads))

    def decode(self, tokens: np.ndarray, positions: np.ndarray, sequences: list[list[int]], want: np.ndarray) -> None:
        """One llama_decode: token i at positions[i] in sequences[i] (its first the one it attends as), logits
        for want[i]."""
        n = len(tokens)
        stride = max(len(s) for s in sequences)
        seq_ids = np.zeros((n, stride), dtype=np.int32)
        for i, seqs in enumerate(sequences):
            seq_ids[i, :len(seqs)] = seqs
        counts = np.array([len(s) for s in sequences], dtype=np.int32)
        tokens, positions = np.ascontiguousarray(tokens, np.int32), np.ascontiguousarray(positions, np.int32)
        want = np.ascontiguousarray(want, np.int8)
        code = self.lib.bd_decode(self.handle, n, _ptr(tokens), _ptr(positions), _ptr(counts), _ptr(seq_ids), stride,
                                  _ptr(want))
        if code == 1:
            raise EngineError(f"llama.cpp's memory is full ({self.n_ctx} cells): give the GGUF target a larger "
                              "context (`generate --n-ctx N`, load_target(..., n_ctx=N)) or decode fewer rows at once")
        if code != 0:
            raise EngineError(f"llama_decode failed (code {code}) on a batch of {n} tokens")

    def logits(self, indices: np.ndarray) -> np.ndarray:
        indices = np.ascontiguousarray(indices, np.int32)
        out = np.empty((len(indices), self.n_vocab), dtype=np.float32)
        if self.lib.bd_logits(self.handle, len(indices), _ptr(indices), _ptr(out)) != 0:
            raise EngineError("llama.cpp returned no logits for a position that asked for them")
        return out

    def layer(self, lid: int, n: int) -> np.ndarray:
        out = np.empty((n, self.n_embd), dtype=np.float32)
        if self.lib.bd_layer(self.handle, lid, n, _ptr(out)) != 0:
            raise EngineError(f"llama.cpp captured no input of layer {lid}: this architecture's graph does not "
                              "expose it")
        return out

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        if not self.lib.bd_seq_rm(self.handle, seq, p0, p1):
            raise EngineError(f"llama.cpp could not remove positions [{p0}, {p1}) of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.lib.bd_seq_cp(self.handle, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return self.lib.bd_seq_pos_max(self.handle, seq)

    def clear(self) -> None:
        self.lib.bd_clear(self.handle)
