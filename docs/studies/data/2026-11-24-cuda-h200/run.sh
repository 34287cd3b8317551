#!/bin/bash
# One call on a lent H200: CUDA benchmarks at the 1.5B target's shapes (random weights) and the CUDA path of the
# tests. Run from the repository root with two folders beside it (both git-ignored, carried to the machine):
#   .whl/  wheels the machine lacks: transformers==5.23.0 tokenizers==0.23.3 gguf==0.19.0 dflash==0.1.0 (cp312)
#   .gpu/  make_models.py (this folder), q15/ and q05/ holding config.json + generation_config.json of
#          qwen2.5-coder-1.5b-instruct / -0.5b-instruct, and q15/ the tokenizer files (`blockdraft assets path NAME`)
# The test step timed out at 240 s in the recorded run; tests-*.log hold the later calls (see the study page).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch,transformers;print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
timeout 120 python3 .gpu/make_models.py 2>&1 | grep -v Loading
B="timeout 90 python3 -m blockdraft"
$B bench-verify --target /tmp/q15 --device cuda --dtype bf16 fp32 --tokens 1 2 4 8 16 32 64 128 256 2>&1 | tee $OUT/verify.txt
for args in "" "--tree 32" "--tree 64" "--tree measured" "--draft-model /tmp/q05"; do
  echo "== bench-engine $args"; $B bench-engine --target /tmp/q15 --device cuda --max-new-tokens 128 --repeats 3 $args 2>&1 | grep -v Loading
done | tee $OUT/engine.txt
( $B bench-train --target /tmp/q15 --device cuda --repeats 5;
  $B bench-train --target /tmp/q15 --device cuda --repeats 5 --layers 5 --seq-len 3072 --num-anchors 512 --objectives decay ) 2>&1 | grep -v Loading | tee $OUT/train.txt
BLOCKDRAFT_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider --durations=8 \
  tests/test_decode_greedy.py tests/test_tree.py tests/test_decode_batch.py tests/test_decode_sampling.py tests/test_dflash.py 2>&1 | tee $OUT/tests.log | tail -60
