"""kill -9 resume: `blockdraft train` on a tiny target killed with SIGKILL 3 times at random moments, each time
`--resume`d, ends with final weights bitwise equal to an uninterrupted run.

    taskset -c 0 python kill9.py [TRIALS] [--seed S] [--steps N]

The recipe is tests/train/test_train.py's tiny one (a tiny chat target, 12 conversations), with more steps so the
kills land mid-run. Each kill lands at a random moment of training: after a random step (drawn between the step the run
resumed from and the end; metrics.jsonl is watched) plus a random 0-50 ms, so kills fall inside steps and
checkpoint writes (save_every 7: a resume redoes the steps since the last checkpoint). Exit 1 when any trial differs or fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers import tiny_training_setup  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def recipe(root: Path, model: Path, steps: int) -> Path:
    fields = dict(target=str(model), data=str(root / "data.jsonl"), max_length=128, block_size=4, num_layers=1,
                  objective="decay", lr=3e-3, max_steps=steps, num_anchors=8, save_every=7, log_every=1,
                  target_dtype="fp32", autocast_bf16=False, threads=1, seed=3)
    path = root / "recipe.json"
    path.write_text(json.dumps(fields))
    return path


def logged_step(out: Path) -> int:
    """The last step metrics.jsonl records (-1 before the first)."""
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1
    steps = []
    for line in lines:
        try:
            steps.append(int(json.loads(line).get("step", -1)))
        except (ValueError, AttributeError):
            pass
    return max(steps, default=-1)


def train(config: Path, out: Path, *resume: str, kill_at: int | None = None,
          delay: float = 0.0) -> tuple[str, float, int]:
    """Run `blockdraft train`; with kill_at, SIGKILL its process group `delay` seconds after metrics.jsonl logs
    step kill_at. Returns (what happened, seconds, last logged step at the kill)."""
    argv = [sys.executable, "-m", "blockdraft", "train", "--config", str(config), f"out_dir={out}", *resume]
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if kill_at is not None:
        while proc.poll() is None and logged_step(out) < kill_at and time.monotonic() - start < 600:
            time.sleep(0.002)
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "killed", time.monotonic() - start, logged_step(out)
    try:
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return "hang", time.monotonic() - start, logged_step(out)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        return f"rc {proc.returncode}: {err.decode(errors='replace')[-400:]}", seconds, logged_step(out)
    return "finished", seconds, logged_step(out)


def digest(out: Path) -> str:
    return hashlib.sha256((out / "final" / "model.safetensors").read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("trials", type=int, nargs="?", default=3)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        root, model = tiny_training_setup(root)
        config = recipe(root, model, args.steps)
        what, wall, _ = train(config, root / "reference")
        assert what == "finished", what
        reference = digest(root / "reference")
        print(f"uninterrupted: {wall:.1f}s, {args.steps} steps, final sha256 {reference[:16]}", flush=True)
        for trial in range(args.trials):
            out = root / f"trial{trial}"
            events, resume, step = [], (), 0
            for kill in range(3):
                # a random step between where this run starts and the end, then a random moment inside it
                kill_at = rng.randint(step + 1, args.steps - 3 * (3 - kill))
                delay = rng.uniform(0.0, 0.05)
                what, seconds, logged = train(config, out, *resume, kill_at=kill_at, delay=delay)
                saved = sorted(p.parent.name for p in (out / "checkpoints").glob("step_*/train_state.pt"))
                events.append(f"kill {kill + 1} after step {kill_at}+{delay * 1000:.0f}ms: {what} "
                              f"(logged {logged}, checkpoints {saved[-1:] or 'none'})")
                if what != "killed":
                    break
                step = max(logged, 0)
                resume = ("--resume",) if saved else ("--overwrite",)
            if what == "killed":
                what, seconds, _ = train(config, out, *resume)
            equal = what == "finished" and digest(out) == reference
            failed += not equal
            print(f"trial {trial + 1}: {'EQUAL' if equal else 'DIFFERENT'}; " + "; ".join(events)
                  + f"; final {' '.join(resume)} run: {what} {seconds:.1f}s", flush=True)
    print(f"{args.trials - failed}/{args.trials} trials bitwise equal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
