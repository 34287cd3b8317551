"""The check that proves a llama.cpp build runs: prefill CHECK_PROMPT tokens in one pass, then decode
CHECK_DECODE one at a time, with the build's `llama-bench` on a tiny `llama` GGUF of random weights that
is written here (engines/llamacpp.py calls it after every build, and marks a build verified only when it passes).

Why quantized: a build can pass `--version` and single-token decoding yet crash on its first prompt
pass, because ggml's CPU backend sends a multi-token matrix product of Q4_0/Q4_1/Q8_0/K-quant weights
to another kernel than a one-token product (on a CPU listing AMX, `tinygemm_kernel_amx`, compiled in by
`-march=native`). So the weight matrices are Q8_0, and every dimension is a multiple of 32 (the AMX
kernels' tile: a matrix product whose rows or columns are not, takes the ordinary path and proves nothing).

The vocabulary is a sentencepiece-style (`llama`) one of three special tokens, the 256 byte tokens and a
few words: enough for llama.cpp to load it; the check feeds random token ids and reads no text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from ..files import write_atomic

CHECK_GGUF = "check.gguf"  # in the release folder, written once
CHECK_PROMPT, CHECK_DECODE = 8, 4  # tokens prefilled in one pass (the kernel that crashed), then decoded
CHECK_TIMEOUT_S = 300
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, CONTEXT = 128, 4, 2, 256, 2, 256
SPECIAL = ("<unk>", "<s>", "</s>")
WORDS = 29  # 3 special + 256 bytes + 29 words = 288 tokens, a multiple of 32 (the output matrix's rows)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of the tiny sentencepiece vocabulary."""
    import gguf  # deferred: gguf takes ~0.4 s to import, which the CLI and `blockdraft.engines` do not pay

    kinds = gguf.TokenType
    tokens = [*SPECIAL, *(f"<0x{byte:02X}>" for byte in range(256)), *(f"\u2581w{i}" for i in range(WORDS))]
    types = [kinds.UNKNOWN, kinds.CONTROL, kinds.CONTROL, *[kinds.BYTE] * 256, *[kinds.NORMAL] * WORDS]
    scores = [0.0] * (len(SPECIAL) + 256) + [-float(i) for i in range(WORDS)]
    return tokens, scores, [int(kind) for kind in types]


def write_check_gguf(path: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny model at `path` (atomically) and return it."""
    import gguf  # deferred, as above
    import numpy as np

    tokens, scores, types = vocabulary()
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def matrix(rows: int, cols: int) -> np.ndarray:  # (rows, cols) = (out features, in features), Q8_0 bytes
        weights = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        return gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)

    def write(partial: Path) -> None:
        writer = gguf.GGUFWriter(str(partial), "llama")
        writer.add_name("blockdraft llama.cpp build check (random weights)")
        writer.add_context_length(CONTEXT)
        writer.add_embedding_length(HIDDEN)
        writer.add_block_count(LAYERS)
        writer.add_feed_forward_length(FFN)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(KV_HEADS)
        writer.add_rope_dimension_count(head_dim)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_vocab_size(len(tokens))
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        q8 = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor("token_embd.weight", matrix(len(tokens), HIDDEN), raw_dtype=q8)
        writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor("output.weight", matrix(len(tokens), HIDDEN), raw_dtype=q8)
        shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * head_dim, HIDDEN),
                  "attn_v": (KV_HEADS * head_dim, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
                  "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
        for layer in range(LAYERS):
            writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
            writer.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
            for name, (rows, cols) in shapes.items():
                writer.add_tensor(f"blk.{layer}.{name}.weight", matrix(rows, cols), raw_dtype=q8)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    write_atomic(path, write)
    return Path(path)


def run_check_command(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run the check: (exit status, negative for a signal as subprocess has it, None on timeout; stdout; stderr)."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                              timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        return None, "", expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else ""
    return done.returncode, done.stdout, done.stderr


def check_decode(bench: Path, model: Path) -> dict:
    """Run `bench` (a llama-bench) on `model` (the check GGUF, written first if missing): the result as the
    build's marker records it ({"command", "passed", "exit", "seconds", then "tokens_per_second" when it
    passed or "failure" and the output's last lines when it did not})."""
    if not model.is_file():
        write_check_gguf(model)
    argv = [str(bench), "-m", str(model), "-p", str(CHECK_PROMPT), "-n", str(CHECK_DECODE), "-r", "1",
            "-t", str(min(4, os.cpu_count() or 1)), "-o", "json"]
    started = time.monotonic()
    status, stdout, stderr = run_check_command(argv, CHECK_TIMEOUT_S)
    result: dict = {"command": " ".join([Path(bench).name, *argv[1:]]), "passed": status == 0, "exit": status,
                    "seconds": round(time.monotonic() - started, 2)}
    if status is None:
        result["failure"] = f"no result within {CHECK_TIMEOUT_S} s"
    elif status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else f"signal {-status}"
        result["failure"] = f"killed by {name}" + (" (an instruction this CPU does not run)" if name == "SIGILL" else "")
    elif status > 0:
        result["failure"] = f"exit {status}"
    else:
        result["tokens_per_second"] = bench_speeds(stdout)
    if not result["passed"]:
        result["output"] = "\n".join((stdout + "\n" + stderr).strip().splitlines()[-12:])
    return result


def bench_speeds(stdout: str) -> dict[str, float]:
    """llama-bench's JSON -> {"prompt": tok/s, "decode": tok/s} ({} where it is unreadable)."""
    try:
        rows = json.loads(stdout)
    except ValueError:
        return {}
    speeds = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("avg_ts"), (int, float)):
            speeds["prompt" if row.get("n_gen") == 0 else "decode"] = round(float(row["avg_ts"]), 1)
    return speeds


def check_sentence(check: dict) -> str:
    """The check's result in words (its output's last lines when it failed)."""
    what = f"prefill {CHECK_PROMPT} tokens, then decode {CHECK_DECODE} (`{check['command']}`)"
    if check["passed"]:
        rates = ", ".join(f"{name} {rate} tok/s" for name, rate in (check.get("tokens_per_second") or {}).items())
        return f"decode check passed: {what}" + (f": {rates}" if rates else "")
    return f"decode check FAILED: {what}: {check.get('failure')}\n{check.get('output', '')}".rstrip()
