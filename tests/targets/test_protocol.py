"""Every target engine against `decode/target.py`, member by member, as `tests/system/test_imports.py` holds the
floors: each member of `TargetModel` and `RowsCache` present, each method with the protocol's signature. Also:
`import blockdraft` loads neither the `gguf` package nor the export stack, and `docs/design.md`'s worked
example ("A target engine, worked") adds an engine with one module and one line.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import blockdraft
from blockdraft import targets
from blockdraft.config import ConfigError
from blockdraft.decode.target import RowsCache, TargetModel, is_target_model, members
from blockdraft.drafters.lookup import LookupDrafter
from blockdraft.engines.llamacpp import EngineError, find_llamacpp
from gguf_models import write_tiny_gguf
from helpers import prompts, tiny_target

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
MISSING = object()


def _shape(function) -> list[tuple]:
    """A signature as (name, kind, default) per parameter, `self` left out (annotations are the protocol's word)."""
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]
    return [(p.name, p.kind, p.default) for p in parameters]


def protocol_gaps(obj, protocol) -> list[str]:
    """What `obj` lacks of `protocol`, or declares otherwise: a missing member, a method that is not one, a
    method whose parameters differ from the protocol's (names, kinds, defaults)."""
    gaps = []
    for name, declared in members(protocol).items():
        found = inspect.getattr_static(obj, name, MISSING)
        if found is MISSING:
            gaps.append(f"{name}: missing")
        elif inspect.isfunction(declared):
            if not inspect.isfunction(found):
                gaps.append(f"{name}: not a method ({type(found).__name__})")
            elif _shape(found) != _shape(declared):
                gaps.append(f"{name}: {inspect.signature(found)} is not the protocol's {inspect.signature(declared)}")
    return gaps


def assert_honours_the_protocol(target) -> None:
    assert protocol_gaps(target, TargetModel) == []
    assert is_target_model(target)
    rows = target.open_rows()
    try:
        assert protocol_gaps(rows, RowsCache) == []
    finally:
        rows.close()


def test_the_checker_sees_a_missing_member_and_a_changed_signature():
    """Negative control: an engine that drops `close` and takes `verify`'s arguments in another order fails."""
    target = tiny_target()
    rows = target.open_rows()

    class Broken:
        rows, layer_ids = [], ()

        def prefill(self, rows, prompts): ...

        def verify(self, starts, anchors, proposals): ...  # swapped

        def keep(self, still, starts, kept, paths, width): ...

        def drop(self, still, starts): ...

        def forward(self, input_ids, start, logits_to_keep=1): ...  # another default

        def crop(self, length): ...

    assert protocol_gaps(rows, RowsCache) == []
    gaps = protocol_gaps(Broken(), RowsCache)
    assert [gap.split(":")[0] for gap in gaps] == ["verify", "forward", "close"]
    assert not is_target_model(rows) and not is_target_model(type(target))


def test_the_transformers_engine_honours_the_protocol():
    assert_honours_the_protocol(tiny_target())
    assert_honours_the_protocol(tiny_target("gemma3"))  # sliding-window layers: the same members


@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory):
    try:
        find_llamacpp()
    except EngineError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI builds llama.cpp before the tests (.ci/run), yet: {err}")
        pytest.skip(f"needs a llama.cpp build: {err}")
    path = write_tiny_gguf(tiny_target().model, tmp_path_factory.mktemp("protocol") / "tiny.gguf")
    return blockdraft.load_target(path, threads=1)


def test_the_gguf_engine_honours_the_protocol(gguf_target):
    assert_honours_the_protocol(gguf_target)


PROBE = """
import json, sys
import blockdraft
from blockdraft.targets import llama_lib
{extra}
print(json.dumps({{"modules": sorted(sys.modules), "llama_library": llama_lib._LIB is not None}}))
"""


def _loaded(extra: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(extra=extra)], capture_output=True, text=True,
                         check=True, cwd=DESIGN.parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gguf_or_export(modules: list[str]) -> list[str]:
    stack = ("blockdraft.export", "blockdraft.checkpoints.export", "blockdraft.engines.llamacpp_export")
    return [m for m in modules if m == "gguf" or m.startswith("gguf.") or m.startswith(stack)]


def test_import_blockdraft_loads_neither_gguf_nor_the_export_stack():
    plain = _loaded()
    assert _gguf_or_export(plain["modules"]) == []
    assert not plain["llama_library"]  # llama.cpp's library: loaded by the first GGUF target only
    # the probe sees them when they are loaded (negative control)
    seen = _loaded("import gguf\nimport blockdraft.export")
    assert "gguf" in _gguf_or_export(seen["modules"]) and "blockdraft.export" in _gguf_or_export(seen["modules"])


def test_a_gguf_path_is_refused_where_a_transformers_model_is_needed(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    assert targets.engine_for(path).name == "llama.cpp" and targets.engine_for("some-asset").name == "transformers"
    assert not targets.engine_for(path).casts_weights
    with pytest.raises(ConfigError, match="is a GGUF file: this command takes a Hugging Face model folder"):
        targets.load_target(path, engine="transformers")
    with pytest.raises(ConfigError, match="no target engine 'mlx'"):
        targets.load_target(path, engine="mlx")
    with pytest.raises(ConfigError, match="options of a GGUF target"):
        targets.load_target(tiny_target().model, threads=2)
    loaded = tiny_target()
    assert targets.load_target(loaded) is loaded  # a target already, of any engine


@pytest.fixture
def tiny_engine(monkeypatch):
    """docs/design.md's worked example ("A target engine, worked"): its module run as written, its line added."""
    text = DESIGN.read_text().split("### A target engine, worked", 1)[1]
    module_code, line = [block.split("```", 1)[0] for block in text.split("```python\n")[1:3]]
    namespace: dict = {}
    exec(compile(module_code, str(DESIGN), "exec"), namespace)
    tiny = SimpleNamespace(**namespace)
    engine = eval(line.strip().rstrip(","), {"Engine": targets.Engine, "tiny": tiny})
    monkeypatch.setattr(targets, "ENGINES", (engine, *targets.ENGINES))
    return engine


def test_a_new_engine_is_one_module_and_one_line(tiny_engine):
    assert targets.engine_for("tiny:qwen3") is tiny_engine and targets.engine_for("qwen3").name == "transformers"
    target = blockdraft.load_target("tiny:qwen3", dtype="fp32")
    assert_honours_the_protocol(target)
    prompt = prompts(1)[0]
    plain = blockdraft.generate(target, None, prompt, max_new_tokens=8, stop_token_ids=())
    looked_up = blockdraft.generate(target, LookupDrafter(4), prompt, max_new_tokens=8,
                                    stop_token_ids=())
    assert len(plain.tokens) == 8 and looked_up.tokens == plain.tokens  # the loop runs on it, lossless
    with pytest.raises(ConfigError, match="is a tiny:ARCH name: this command takes a Hugging Face model folder"):
        targets.load_target("tiny:qwen3", engine="transformers")
