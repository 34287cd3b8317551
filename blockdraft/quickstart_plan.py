"""The quickstart's budget arithmetic: the shares of the time, the throughput it is sized by, and what a
stage can do in its seconds (`quickstart.py` runs the stages; these are pure functions of the numbers)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ConfigError
from .eval.report import MIN_PROMPTS


# Shares of the budget; each stage gets its share of the time left among the stages still to run, so time
# a stage does not use goes to the ones after it (`stage_seconds`). Each stops starting new work (a
# regeneration batch, a cached sequence, a training step, a benchmark prompt) at its deadline, so the job
# keeps to the budget on a slow or shared machine as on a fast one.
SHARES = {"regen": 0.30, "train": 0.30, "bench": 0.25}
CHECK_SHARE = 0.10  # a float32 check run apart from a bf16 benchmark; a float32 benchmark answers it for free
FEATURES_SHARE = 0.45  # of the training share (with existing answers): the teacher-forced feature pass
REPORT_S = 30.0  # the summary and the report, after the last stage
MAX_LENGTH = 768  # tokens per training conversation
TOPK = 32  # the cached top-k log-probabilities (train.config.DEFAULT_CACHE_TOPK)
# The drafter the quickstart trains, for its cost per step: one layer, 64 anchors x blocks of 8, an
# 8,192-token draft vocabulary.
DRAFT_LAYERS, NUM_ANCHORS, BLOCK_SIZE, DRAFT_VOCAB = 1, 64, 8, 8192
WARMUP_TOKENS = 16  # eval.bench.WARMUP_TOKENS: every method's warm-up generation
SLOWER = 1.6  # a method's tokens cost up to this many plain steps each on a CPU (docs/hardware.md)
BENCH_TOKENS = (32, 128)  # new tokens per benchmark prompt: the fewest worth a speedup, the most worth waiting for
BENCH_PROMPTS = 10  # the benchmark asks for at most this many; its hard deadline stops before one that would not fit
# Where a llama.cpp build and the target's GGUF exist, the benchmark stage also runs llama.cpp's rows
# (`quickstart_llamacpp.py`) in this part of its seconds, after the main benchmark (which keeps the rest), for
# as many new tokens as the README's llama.cpp table (the schedule's long lookup drafts need answers to repeat).
LLAMACPP_SHARE = 0.25
LLAMACPP_TOKENS = 96
# A drafter memorises its data from about 14 steps per training conversation on (docs/studies, data and
# schedule): the steps the time buys are capped there, so a fast machine does not train past it.
STEPS_PER_CONVERSATION = 14
CHECK_TOKENS = (8, 32)  # new tokens the float32 check decodes with each method: the fewest it runs, the most
FP32_STEP = 2.0  # a float32 step costs about two bf16 steps on a native-bf16 CPU (docs/hardware.md)
FP32_LOAD = 1.5  # loading the target in float32, against the probe's loading at `auto` precision
# A method's first float32 run, its building included (a measured tree times verify passes), against plain
# decoding's run of as many tokens; later methods are predicted from the slowest ratio seen.
CHECK_METHOD_COST = 3.0
CHECK_MOST = 0.25  # of the budget: a check that needs more is skipped up front (the benchmark gets its time)
CHECK_GRACE = 0.05  # of the budget: the trained drafter's check may end this far past the deadline (+10% kept)


def bench_share(dtype: str) -> float:
    """The benchmark's share; in float32 it is also the losslessness check, and takes that share too."""
    return SHARES["bench"] + (CHECK_SHARE if dtype == "fp32" else 0.0)


@dataclass(frozen=True)
class Throughput:
    """What a few seconds of the target on this machine say (`probe_throughput`, `remeasure`)."""

    dtype: str  # "bf16" or "fp32": `auto` on this machine (bf16 only where native), for every stage
    pass_tok_s: float  # a teacher-forced pass (features, logits and top-k) over one sequence, tokens per second
    step_s: float  # one cached one-token decoding step, seconds
    step_target_tokens: float  # one drafter training step costs about a pass over this many target tokens
    load_s: float  # loading the target
    probe_s: float  # the whole probe, loading included


def train_work(seconds: float, speed: Throughput, *, answers: bool) -> tuple[int, int]:
    """(feature tokens, training steps) that `seconds` of training buy at `speed`. With existing answers the
    feature pass gets FEATURES_SHARE of them and the steps the rest."""
    features_s = FEATURES_SHARE * seconds if answers else 0.0
    step_s = speed.step_target_tokens / speed.pass_tok_s
    if not answers:  # regeneration made the data; the features of its few conversations come online-cheap
        step_s *= 1.2
    return int(features_s * speed.pass_tok_s), int(max(10, (seconds - features_s) / step_s))


def bench_work(seconds: float, speed: Throughput, *, methods: int, prompt_tokens: int) -> tuple[int, int]:
    """(prompts, new tokens per prompt) that `seconds` of benchmark buy: every one of `methods` loads, warms
    up once, then prefills `prompt_tokens` and decodes per prompt. MIN_PROMPTS prompts first (one prompt
    measures nothing), then new tokens up to BENCH_TOKENS[1]; at BENCH_TOKENS[0] tokens, as many prompts as
    fit, at least one."""
    bench_s = seconds - 2 * speed.load_s  # the target, the small draft, the drafters
    prefill_s = prompt_tokens / speed.pass_tok_s
    warm_ups = methods * (prefill_s + WARMUP_TOKENS * SLOWER * speed.step_s)  # once, on the first prompt
    per_token = methods * SLOWER * speed.step_s  # a new token of every method, one prompt
    fewest, most = BENCH_TOKENS
    tokens = (bench_s - warm_ups - MIN_PROMPTS * methods * prefill_s) / (MIN_PROMPTS * per_token)
    bench_tokens = int(min(most, max(fewest, tokens)))
    one_prompt = methods * prefill_s + bench_tokens * per_token
    prompts = int(min(BENCH_PROMPTS, max(1, (bench_s - warm_ups) // max(one_prompt, 1e-9))))
    return max(1, prompts), bench_tokens


def check_seconds(tokens: int, speed: Throughput, prompt_tokens: int, *, methods: int = 1) -> float:
    """What the separate float32 check costs: load the target in float32, then plain decoding and `methods`
    methods (the trained drafter's first) each prefill the prompt and decode `tokens` tokens."""
    run_s = FP32_STEP * (prompt_tokens / speed.pass_tok_s + tokens * speed.step_s)
    return FP32_LOAD * speed.load_s + run_s * (1 + CHECK_METHOD_COST * methods)


def check_tokens(seconds: float, speed: Throughput, prompt_tokens: int) -> int | None:
    """The most tokens (within CHECK_TOKENS) whose float32 check fits `seconds`; None when not even the fewest."""
    fewest, most = CHECK_TOKENS
    for tokens in range(most, fewest - 1, -8):
        if check_seconds(tokens, speed, prompt_tokens) <= seconds:
            return tokens
    return None


@dataclass(frozen=True)
class Plan:
    """How much of each stage a budget buys on this machine (from `Throughput`; docs/hardware.md)."""

    train_conversations: int
    regen_tokens: int
    train_steps: int
    bench_prompts: int
    bench_tokens: int
    feature_tokens: int = 0  # tokens the feature pass can cache in its share (0: not sized by a probe)

    @classmethod
    def for_budget(cls, minutes: float) -> "Plan":
        """Without a probe: the shape of the work only (its amounts are kept by the stages' deadlines)."""
        if minutes <= 0:
            raise ConfigError(f"--budget must be positive minutes, got {minutes}")
        scale = min(1.0, minutes / 30.0)
        return cls(train_conversations=max(8, int(64 * scale)), regen_tokens=max(32, int(192 * scale)),
                   train_steps=max(10, int(400 * scale)), bench_prompts=max(1, int(3 * scale)),
                   bench_tokens=max(32, int(128 * scale)))

    def steps_for(self, conversations: int) -> int:
        """The steps to train on `conversations`: what the time buys, at most STEPS_PER_CONVERSATION each."""
        return min(self.train_steps, max(10, STEPS_PER_CONVERSATION * conversations))

    @classmethod
    def for_machine(cls, minutes: float, left_s: float, speed: Throughput, *, answers: bool, methods: int,
                    prompt_tokens: int) -> "Plan":
        """The work each stage's share of `left_s` seconds buys at the probed `speed` (`train_work`,
        `bench_work`): the first plan, which each stage sizes again from the time and speed it starts with."""
        shape = cls.for_budget(minutes)
        train_s = (SHARES["train"] + (SHARES["regen"] if answers else 0.0)) * left_s
        feature_tokens, train_steps = train_work(train_s, speed, answers=answers)
        prompts, tokens = bench_work(bench_share(speed.dtype) * left_s, speed, methods=methods,
                                     prompt_tokens=prompt_tokens)
        return cls(train_conversations=shape.train_conversations, regen_tokens=shape.regen_tokens,
                   train_steps=train_steps, bench_prompts=prompts, bench_tokens=tokens,
                   feature_tokens=feature_tokens)
