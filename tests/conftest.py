import os

import pytest
import torch

# tests/ mirrors the package (tests/decode/ tests blockdraft/decode/ ...; cross-cutting suites in tests/system/).
# Test files in the folders import the shared helpers here (`from helpers import ...`): pytest's default
# prepend import mode puts this conftest's folder on sys.path, so they need no __init__.py; basenames stay unique.

# Tiny test models are fastest single-threaded (thread spin-up dominates a 64-wide matmul).
torch.set_num_threads(1)

# GGUF targets run on the engine `blockdraft engines choose` picked for this machine; the suite pins the reference
# engine (llama.cpp, which CI builds) unless told otherwise: BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python -m pytest ...
os.environ.setdefault("BLOCKDRAFT_GGUF_ENGINE", "llama.cpp")


def pytest_addoption(parser):
    parser.addoption("--run-real", action="store_true", default=False,
                     help="run tests marked real_assets (need `blockdraft assets fetch` first)")


def pytest_configure(config):
    config.addinivalue_line("markers", "real_assets: needs the real models/datasets fetched by `blockdraft assets`")
    config.addinivalue_line("markers", "slow: slower checks, still offline")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-real") or os.environ.get("BLOCKDRAFT_RUN_REAL") == "1":
        return
    skip = pytest.mark.skip(reason="real-asset test: run with `pytest -m real_assets --run-real`")
    for item in items:
        if "real_assets" in item.keywords:
            item.add_marker(skip)
