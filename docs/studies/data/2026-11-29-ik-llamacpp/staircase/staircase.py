"""The verify pass's cost at every length: our GGUF target's pass over k + 1 tokens (the anchor and k drafts, logits
at every position) after 64 cached ones, k = 0..24, median of REPEATS (measure_verify_cost, the timing the
schedule uses), ROUNDS rounds; one JSON line a round. BLOCKDRAFT_GGUF_ENGINE picks the engine.
Usage: REPEATS=7 ROUNDS=3 python staircase.py F.gguf"""
import json, os, sys
import blockdraft
from blockdraft.decode.cost import measure_verify_cost
from blockdraft.targets.llama_lib import loaded_engine

target = blockdraft.load_target(sys.argv[1], threads=int(os.environ.get("THREADS", 2)))
for round_ in range(int(os.environ.get("ROUNDS", 3))):
    seconds = measure_verify_cost(target, list(range(25)), repeats=int(os.environ.get("REPEATS", 7)))
    print(json.dumps({"engine": loaded_engine(), "round": round_, "pass_tokens_s": {k + 1: s for k, s in seconds.items()}}),
          flush=True)
