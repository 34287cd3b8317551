"""Opt-in: the same drafter on the same weights drafts the same in llama.cpp as in our loop.

Runs with `pytest -m real_assets --run-real` when a verified llama.cpp build is found (`blockdraft
engines build llama.cpp`) and the qwen2.5-coder-0.5b-instruct asset is fetched: llama.cpp's converter
checks the pre-tokenizer by hash and does not know our tiny test tokenizers, so the tiny random target is
built on the real Qwen2.5 tokenizer (vocabulary 151,936, hidden 64, 2 layers). Target and drafters are
converted to F32 GGUFs; both engines decode the same prompts greedily for 40 tokens ignoring EOS; tokens
must be equal and the mean committed tokens per verify round (tau) within 3%. Cases:
  - a Qwen3 target with a DFlash drafter;
  - a Qwen2 target (random q/k/v biases) run as its llama-architecture copy (`engines as-llama`), whose
    rows move for the other rope;
  - a DFlash 2 drafter (block convolution + candidate selector) on the Qwen3 target;
  - DSpark: the Qwen3 DFlash drafter with a fitted Markov head and confidence head (`draft-dspark`), at
    conf_min 0 (no pruning) and at a conf_min where llama.cpp's pruning rule and ours coincide;
  - ngram-mod combined with the DFlash drafter (`draft-dflash,ngram-mod`): tokens equal plain greedy and
    both drafted; no tau parity, since we have no identical combination.
Each target (its conversion) and each fitted drafter is built once per module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import init_drafter, save_drafter
from blockdraft.checkpoints.headed import save_headed_drafter
from blockdraft.drafters.confidence import ConfidenceHead
from blockdraft.drafters.markov import MarkovHead
from blockdraft.engines.gguf_arch import qwen2_gguf_as_llama
from blockdraft.engines.llamacpp import EngineError, find_llamacpp
from blockdraft.engines.gguf_files import convert_target_gguf
from blockdraft.engines.llamacpp_server import LlamaServer, Timings
from blockdraft.eval.llamacpp_runner import parse_llamacpp, server_arguments
from blockdraft.export.gguf import export_drafter_gguf
from blockdraft.targets.transformers import Target
from blockdraft.train.quick import quick_fit, train_heads
from gguf_models import real_tokenizer_target
from helpers import headed

NEW_TOKENS, BLOCK, RANK = 40, 4, 16
TAU_TOLERANCE = 0.03
# llama.cpp's F32 graph and ours agree on a confidence to ~1e-5; a threshold this far from every
# confidence of the run decides every slot the same way in both
CONFIDENCE_MARGIN = 1e-3
pytestmark = pytest.mark.real_assets  # minutes of conversion and several servers: never in the default suite


@dataclass
class Setup:
    """A tiny target on the real tokenizer, its prompts, its own text to fit drafters on, its plain greedy
    continuations, and the F32 GGUF llama.cpp runs it from."""

    arch: str
    root: Path
    target: Target
    folder: Path
    gguf: Path
    prompts: list[list[int]]
    text: list[torch.Tensor]
    plain: list[list[int]]
    drafters: dict = field(default_factory=dict)  # drafter kind -> (folder, draft GGUF, export facts)


def make_setup(root: Path, arch: str) -> Setup:
    model, _, folder = real_tokenizer_target(root, arch, layers=2)
    if arch == "qwen2":  # Hugging Face starts biases at zero: make them count, so a wrong row order shows
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
        model.save_pretrained(folder)
    target = Target(model.eval(), name=str(folder))
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1000, 30000, (12,), generator=generator).tolist() for _ in range(3)]
    text = []
    for prompt in prompts:  # the target's own continuations: text a drafter can learn to accept
        result = blockdraft.generate(target, None, torch.tensor([prompt]), max_new_tokens=64, stop_token_ids=())
        text.append(torch.tensor(prompt + result.tokens))
    plain = [tokens[len(prompt):len(prompt) + NEW_TOKENS].tolist() for prompt, tokens in zip(prompts, text)]
    gguf = convert_target_gguf(folder, root / "target-f32.gguf", outtype="f32")
    if arch == "qwen2":
        gguf = qwen2_gguf_as_llama(gguf, root / "target-f32-llama.gguf")
    return Setup(arch, root, target, folder, gguf, prompts, text, plain)


def fitted_drafter(setup: Setup, kind: str) -> tuple[Path, Path, dict]:
    """(drafter folder, its GGUF, export facts) of a drafter fitted for a few seconds on the target's text:
    `dflash`, `dflash2` (convolution + selector) or `dspark` (the `dflash` backbone with a Markov head and a
    confidence head fitted on it)."""
    if kind in setup.drafters:
        return setup.drafters[kind]
    folder = setup.root / f"drafter-{kind}"
    if kind == "dspark":
        backbone = blockdraft.load_drafter(str(fitted_drafter(setup, "dflash")[0]), setup.target)
        torch.manual_seed(11)
        drafter = headed(backbone, MarkovHead(setup.target.vocab_size, RANK),
                         ConfidenceHead(setup.target.hidden_size, RANK))
        train_heads(drafter, setup.text, steps=80, lr=1e-2, num_anchors=32)
        save_headed_drafter(drafter, folder)
    else:
        extra = dict(arch="dflash2", selector_rank=8, selector_top_k=4) if kind == "dflash2" else {}
        drafter = init_drafter(setup.target, num_layers=1, block_size=BLOCK, target_layer_ids=(0,), **extra)
        quick_fit(drafter, setup.text, steps=80)
        if setup.arch == "qwen2":  # a Qwen2 target gives its drafter q/k/v/o biases, which llama.cpp's DFlash
            with torch.no_grad():  # graph lacks: zero them, so both engines run the same drafter (zero biases
                for name, parameter in drafter.model.named_parameters():  # export exactly)
                    if name.endswith("_proj.bias"):
                        parameter.zero_()
        save_drafter(drafter.model, folder)
    draft_gguf = setup.root / f"draft-{kind}.gguf"
    _, facts = export_drafter_gguf(folder, setup.folder, draft_gguf)
    setup.drafters[kind] = (folder, draft_gguf, facts)
    return setup.drafters[kind]


@pytest.fixture(scope="module")
def build():
    try:
        return find_llamacpp()
    except EngineError as err:
        pytest.skip(f"opt-in: {err}")


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    """arch -> Setup, each built on first use and shared by the cases on that target."""
    built: dict[str, Setup] = {}

    def get(arch: str) -> Setup:
        if arch not in built:
            built[arch] = make_setup(tmp_path_factory.mktemp(arch), arch)
        return built[arch]

    return get


def decode_ours(setup: Setup, drafter, prompts: list[list[int]] | None = None) -> list:
    return [blockdraft.generate(setup.target, drafter, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                stop_token_ids=()) for prompt in prompts or setup.prompts]


def decode_llamacpp(build, setup: Setup, draft_gguf: Path, args: list[str], log: Path,
                    prompts: list[list[int]] | None = None) -> list[tuple[list[int], Timings]]:
    """One server for these flags; every prompt in turn (one slot, `cache_prompt: false`)."""
    with LlamaServer(build.server, setup.gguf, draft=draft_gguf, extra_args=args, threads=1, log_path=log) as server:
        return [server.complete(prompt, NEW_TOKENS, ignore_eos=True) for prompt in prompts or setup.prompts]


def tau_ours(results) -> float:
    return sum(r.emitted for result in results for r in result.rounds) / sum(len(result.rounds) for result in results)


def tau_llamacpp(answers) -> float:
    return sum(t.decode_tokens for _, t in answers) / sum(t.verify_rounds for _, t in answers)


def assert_parity(label: str, setup: Setup, ours, theirs, *, lossless: bool = False,
                  every_request_drafts: bool = True) -> tuple[float, float]:
    """Equal tokens (and, with `lossless`, equal to plain greedy), as many tokens drafted in both engines,
    drafts in every request (or, where pruning may leave a request without any, in some), tau within 3%."""
    for prompt, result, (tokens, timings), plain in zip(setup.prompts, ours, theirs, setup.plain):
        assert tokens == result.tokens, (label, prompt, tokens, result.tokens)
        if lossless:
            assert tokens == plain, (label, prompt, tokens, plain)
        assert timings.draft_n > 0 or not every_request_drafts, (label, prompt, timings)
    drafted_ours, drafted_theirs = sum(r.proposed for x in ours for r in x.rounds), sum(t.draft_n for _, t in theirs)
    assert drafted_theirs > 0, (label, "llama.cpp drafted nothing")
    assert drafted_ours == drafted_theirs, (label, "drafted tokens", drafted_ours, drafted_theirs)
    tau_a, tau_b = tau_ours(ours), tau_llamacpp(theirs)
    print(f"\n[parity] {setup.arch} {label}: tau ours {tau_a:.4f}, llama.cpp {tau_b:.4f} "
          f"(drafted: {drafted_ours} tokens in both)")
    assert abs(tau_b - tau_a) <= TAU_TOLERANCE * tau_a, (label, tau_a, tau_b)
    return tau_a, tau_b


@pytest.mark.parametrize("arch, drafter_arch", [("qwen3", "dflash"), ("qwen2", "dflash"), ("qwen3", "dflash2")])
def test_acceptance_parity_with_llamacpp(build, setups, arch, drafter_arch):
    setup = setups(arch)
    folder, draft_gguf, facts = fitted_drafter(setup, drafter_arch)
    drafter = blockdraft.load_drafter(str(folder), setup.target)
    args = ["--spec-type", "draft-dflash", "--spec-draft-n-max", str(facts["max_drafts"]), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", "0"]
    theirs = decode_llamacpp(build, setup, draft_gguf, args, setup.root / f"server-{drafter_arch}.log")
    tau, _ = assert_parity(drafter_arch, setup, decode_ours(setup, drafter), theirs)
    assert tau > 1.2, f"the drafter learned too little for a meaningful check (tau {tau:.2f})"


# ---------------------------------------------------------------------------------------------- DSpark


def record_confidences(drafter, first_slot_threshold: float | None = None) -> list[tuple[int, float]]:
    """Every c_k the drafter's pruning rule decides on, as (k, c_k) with k = 0 the block's first slot (it
    is appended to as the drafter drafts). With `first_slot_threshold` the rule becomes llama.cpp's: the
    first slot too ends the block (with nothing drafted) when c_1 is below it."""
    seen: list[tuple[int, float]] = []
    decide = drafter.pruning.stops_before

    def stops_before(k, confidences, unconfident, draft_s):
        seen.append((k, float(confidences[-1])))
        if k == 0 and first_slot_threshold is not None:
            return float(confidences[-1]) < first_slot_threshold
        return decide(k, confidences, unconfident, draft_s)

    drafter.pruning.stops_before = stops_before
    return seen


def pruning_threshold(setup: Setup, backbone, markov, confidence) -> tuple[float, list, list, bool]:
    """A conf_min P at which llama.cpp's pruning and a rule of ours give the same blocks on these prompts,
    and prune. Returns (P, our results at P, their (k, c_k), whether ours ran llama.cpp's first-slot rule).

    The rules (llama.cpp 11434 `common/speculative.cpp`, draft-dspark; ours `drafters/pruning.py`): both end
    the block before the first slot with c_k < P, but ours keeps the first slot whatever c_1 is, where
    llama.cpp then drafts nothing. They coincide on a run whose every c_1 is >= P: such a P is looked for
    first, in the middle of a gap between the confidences of an unpruned run (widest gaps first) below its
    smallest c_1. Since pruning moves the rounds, the pruned run itself must have every c_1 >= P, every c_k
    at least CONFIDENCE_MARGIN from P, and a slot pruned. Failing that, our loop runs with llama.cpp's rule
    (`record_confidences(first_slot_threshold=P)`; an empty proposal is a round of one target token, as
    llama.cpp's draftless step) at a P in any gap."""
    pilot = headed(backbone, markov, confidence, confidence_threshold=1e-12)  # scores every slot, prunes none
    seen = record_confidences(pilot)
    decode_ours(setup, pilot)
    first = min(c for k, c in seen if k == 0)
    values = sorted({round(c, 6) for _, c in seen})
    scored = sorted(c for _, c in seen)

    def balance(gap) -> float:  # how far from half of the pilot's confidences the gap's middle lies
        below = sum(c < (gap[0] + gap[1]) / 2 for c in scored) / len(scored)
        return abs(below - 0.5)

    # gaps wide enough for the margin; those leaving between a fifth and four fifths of the slots below
    # them first, widest first
    gaps = sorted((gap for gap in zip(values, values[1:]) if gap[1] - gap[0] > 2 * CONFIDENCE_MARGIN),
                  key=lambda gap: (balance(gap) > 0.3, gap[0] - gap[1]))
    for llama_rule in (False, True):
        for low, high in [gap for gap in gaps if llama_rule or gap[1] <= first][:12]:
            threshold = float(f"{(low + high) / 2:.6f}")  # as written on llama.cpp's command line
            drafter = headed(backbone, markov, confidence, confidence_threshold=threshold)
            seen = record_confidences(drafter, threshold if llama_rule else None)
            results = decode_ours(setup, drafter)
            if ((llama_rule or min(c for k, c in seen if k == 0) >= threshold + CONFIDENCE_MARGIN)
                    and all(abs(c - threshold) >= CONFIDENCE_MARGIN for _, c in seen)
                    and any(c < threshold for k, c in seen if llama_rule or k > 0)):
                return threshold, results, seen, llama_rule
    pytest.fail(f"no conf_min at which llama.cpp's pruning and ours coincide on these prompts and something is "
                f"pruned (smallest first-slot confidence {first:.4f}; confidences {values[:24]}...)")


def markov_moves_drafts(with_head, without_head) -> bool:
    """Whether the Markov head changed a draft, over the rounds whose contexts are still the same in both."""
    for a, b in zip(with_head, without_head):
        for round_a, round_b in zip(a.rounds, b.rounds):
            if round_a.draft_tokens != round_b.draft_tokens:
                return True
            if round_a.emitted != round_b.emitted:
                break  # the next rounds start from different anchors
    return False


def test_dspark_parity_with_llamacpp(build, setups):
    """A DFlash drafter with a fitted Markov head and confidence head, as llama.cpp's draft-dspark."""
    setup = setups("qwen3")
    folder, draft_gguf, facts = fitted_drafter(setup, "dspark")
    assert facts["spec_type"] == "draft-dspark" and facts["markov"] and facts["confidence"], facts
    drafter = blockdraft.load_drafter(str(folder), setup.target)
    markov, confidence = drafter.heads()["markov"], drafter.heads()["confidence"]
    ours = decode_ours(setup, drafter)
    assert markov_moves_drafts(ours, decode_ours(setup, headed(drafter.backbone, markov, confidence, use_markov=False))), \
        "the fitted Markov head changes no draft: the check would not see a wrong chain"

    def llamacpp_args(conf_min: str) -> list[str]:  # what the bench sends for llamacpp:dspark=D,conf_min=P
        return server_arguments(parse_llamacpp(f"dspark={folder},conf_min={conf_min}"), facts)

    # conf_min 0: no pruning anywhere; the Markov chain alone decides the drafts
    theirs = decode_llamacpp(build, setup, draft_gguf, llamacpp_args("0"), setup.root / "server-dspark.log")
    tau, _ = assert_parity("dspark", setup, ours, theirs, lossless=True)
    assert tau > 1.2, f"the drafter learned too little for a meaningful check (tau {tau:.2f})"
    drafted_unpruned = sum(t.draft_n for _, t in theirs)

    # a conf_min where the rules coincide (every first slot confident enough, or ours run with llama.cpp's
    # first-slot rule) and pruning happens
    threshold, pruned, seen, llama_rule = pruning_threshold(setup, drafter.backbone, markov, confidence)
    theirs = decode_llamacpp(build, setup, draft_gguf, llamacpp_args(f"{threshold:.6f}"),
                             setup.root / "server-dspark-pruned.log")
    print(f"\n[parity] conf_min {threshold:.6f}, ours with {'llama.cpp' if llama_rule else 'our'} first-slot rule: "
          f"{sum(c < threshold for _, c in seen)} of {len(seen)} scored slots below it, smallest first-slot "
          f"confidence {min(c for k, c in seen if k == 0):.4f}")
    assert_parity(f"dspark conf_min={threshold:.6f}", setup, pruned, theirs, lossless=True, every_request_drafts=False)
    assert sum(t.draft_n for _, t in theirs) < drafted_unpruned, "llama.cpp's conf_min pruned nothing"


# ---------------------------------------------------------------------------------------------- ngram-mod + draft

STATISTICS = re.compile(r"statistics\s+([\w-]+): #calls\(b,g,a\) =\s*\d+\s+\d+\s+\d+, #gen drafts =\s*(\d+), "
                        r"#acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+)")


def speculative_statistics(log: str) -> dict[str, dict[str, int]]:
    """llama.cpp's per-implementation draft counts (`common_speculative_print_stats`, logged at trace level,
    `-lv 4`, after each request; cumulative, so the last line of each counts)."""
    stats = {}
    for match in STATISTICS.finditer(log):
        stats[match[1]] = dict(zip(("gen_drafts", "acc_drafts", "gen_tokens", "acc_tokens"), map(int, match.groups()[1:])))
    return stats


def test_ngram_mod_with_a_draft_is_lossless_in_llamacpp(build, setups):
    """`draft-dflash,ngram-mod` (the bench's `ngram=mod`) runs, both implementations draft, and the tokens
    are plain greedy's. Acceptance is llama.cpp's alone: we have no identical combination (our `hybrid:`
    fallback drafts with our own prompt lookup, not ngram-mod's hashed n-gram table)."""
    setup = setups("qwen3")
    folder, draft_gguf, facts = fitted_drafter(setup, "dflash")
    # short n-grams; ngram-mod keeps its table across requests, so each prompt's second request finds its
    # first continuation there and ngram-mod drafts, while the drafter drafts where the table has nothing
    args = server_arguments(parse_llamacpp(f"dflash={folder},ngram=mod"), facts) + [
        "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "8", "-lv", "4"]
    assert args[:2] == ["--spec-type", "draft-dflash,ngram-mod"]
    log = setup.root / "server-dflash-ngram-mod.log"
    prompts = setup.prompts + setup.prompts
    theirs = decode_llamacpp(build, setup, draft_gguf, args, log, prompts)
    for prompt, (tokens, _), plain in zip(prompts, theirs, setup.plain + setup.plain):
        assert tokens == plain, (prompt, tokens, plain)
    stats = speculative_statistics(log.read_text(errors="replace"))
    ours = decode_ours(setup, blockdraft.load_drafter(str(folder), setup.target), prompts)
    half = len(setup.prompts)
    print(f"\n[ngram-mod] tau llama.cpp draft-dflash,ngram-mod {tau_llamacpp(theirs):.4f} (first requests "
          f"{tau_llamacpp(theirs[:half]):.4f}, repeated {tau_llamacpp(theirs[half:]):.4f}); ours, DFlash alone "
          f"{tau_ours(ours):.4f}; llama.cpp per implementation: {stats}")
    assert set(stats) == {"draft-dflash", "ngram-mod"}, f"no per-implementation statistics in {log}: {stats}"
    assert stats["ngram-mod"]["gen_drafts"] > 0 and stats["draft-dflash"]["gen_drafts"] > 0, stats
