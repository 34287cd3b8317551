"""Nothing a user owns is deleted, no checkpoint runs code, bad weights and data are refused by name,
and reports do not claim a speedup the measurements cannot carry."""

import errno
import json
import os
import shutil
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file

import blockdraft
from blockdraft.checkpoints import init_drafter, load_drafter, load_drafter_model, save_drafter
from blockdraft.cli import main
from blockdraft.config import ConfigError
from blockdraft.files import LOCK_NAME, folder_lock
from blockdraft.targets import load_target
from chat_fixtures import save_tiny_chat_model
from blockdraft.train.config import TrainConfig
from blockdraft.train.loop import train

from helpers import write_chat_jsonl


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    save_tiny_chat_model(root / "target", hidden_size=32, num_layers=4)
    write_chat_jsonl(root / "data.jsonl", 8, user_words=5, assistant_words=24, vocab=60, seed=0)
    return root


def config(root, out, **changes):
    fields = dict(target=str(root / "target"), data=str(root / "data.jsonl"), out_dir=str(out), max_length=96,
                  block_size=4, objective="decay", lr=3e-3, max_steps=4, num_anchors=4, save_every=2, log_every=1,
                  target_dtype="fp32", autocast_bf16=False, threads=1, seed=1)
    fields.update(changes)
    return TrainConfig(**fields)


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------ 1. --out never deletes what is not ours


def test_init_drafter_never_deletes_a_folder_it_did_not_write(root, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    init = ["init-drafter", "--target", str(root / "target"), "--block-size", "4", "--dtype", "fp32"]
    assert main(init + ["--out", str(victim)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (victim / "thesis.tex").read_text() == "years of work"
    # the target's own folder is refused even with --overwrite, and keeps its weights
    before = (root / "target" / "model.safetensors").read_bytes()
    assert main(init + ["--out", str(root / "target"), "--overwrite"]) == 2
    assert (root / "target" / "model.safetensors").read_bytes() == before
    # an earlier drafter is replaced without a flag; --overwrite replaces a foreign folder on request
    assert main(init + ["--out", str(tmp_path / "d")]) == 0
    assert main(init + ["--out", str(tmp_path / "d"), "--seed", "7"]) == 0
    assert main(init + ["--out", str(victim), "--overwrite"]) == 0
    assert not (victim / "thesis.tex").exists() and (victim / "model.safetensors").exists()
    # the backup name of a replaced folder can never be one of the user's folders
    (tmp_path / ".d.old").mkdir()
    (tmp_path / ".d.old" / "keep.txt").write_text("mine")
    assert main(init + ["--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / ".d.old" / "keep.txt").read_text() == "mine"


def test_save_drafter_refuses_a_foreign_folder_and_a_file(root, tmp_path):
    model = init_drafter(load_target(root / "target", dtype="fp32"), block_size=4).model
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("a")
    with pytest.raises(ConfigError, match="--overwrite"):
        save_drafter(model, tmp_path / "mine")
    assert (tmp_path / "mine" / "a.txt").exists()
    (tmp_path / "file").write_text("f")
    with pytest.raises(ConfigError, match="file"):
        save_drafter(model, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "f"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


# ------------------------------------------------------------------ 2. resume never unpickles code


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_resume_refuses_a_pickle_payload_without_running_it(root, tmp_path):
    out = tmp_path / "run"
    cfg = config(root, out)
    train(cfg, stop_after=2)
    state_path = out / "checkpoints" / "step_000002" / "train_state.pt"
    marker = tmp_path / "pwned"
    state = torch.load(state_path, weights_only=True)
    state["evil"] = _Payload(str(marker))
    torch.save(state, state_path)
    with pytest.raises(ConfigError, match="refused without running"):
        train(cfg, resume=True)
    assert not marker.exists()



def test_resume_refuses_optimizer_state_for_other_parameters(root, tmp_path):
    """A run saved by an older drafter layout (e.g. Qwen2 drafters before the o_proj bias) names the way
    on, instead of torch's bare ValueError from load_state_dict."""
    out = tmp_path / "run"
    cfg = config(root, out)
    train(cfg, stop_after=2)
    state_path = out / "checkpoints" / "step_000002" / "train_state.pt"
    state = torch.load(state_path, weights_only=True)
    dropped = state["optimizer"]["param_groups"][0]["params"].pop()
    state["optimizer"]["state"].pop(dropped, None)
    torch.save(state, state_path)
    with pytest.raises(ConfigError, match="drafter_init="):
        train(cfg, resume=True)


# ------------------------------------------------------------------ 3. target weights and folders


def _target_copy(root, tmp_path, name):
    return shutil.copytree(root / "target", tmp_path / name)


def test_target_with_missing_or_unexpected_weights_is_refused(root, tmp_path):
    folder = _target_copy(root, tmp_path, "holey")
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if "layers.1.mlp" not in k}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="layers.1.mlp"):
        load_target(folder)
    save_file({**state, "stray.weight": torch.zeros(2)}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="stray.weight"):
        load_target(folder)


def test_a_tied_lm_head_is_not_missing(root, tmp_path):
    folder = _target_copy(root, tmp_path, "tied")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "tie_word_embeddings": True}))
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    target = load_target(folder, dtype="fp32")
    assert torch.equal(target.lm_head.weight, target.embed_tokens.weight)


def test_drafter_as_target_and_tokenizerless_target_say_what_is_wrong(root, tmp_path, capsys):
    assert main(["init-drafter", "--target", str(root / "target"), "--block-size", "4", "--out",
                 str(tmp_path / "d")]) == 0
    with pytest.raises(ConfigError, match="is a DFlash drafter.*--drafter"):
        load_target(tmp_path / "d")
    folder = _target_copy(root, tmp_path, "mute")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    assert load_target(folder).tokenizer is None
    capsys.readouterr()
    assert main(["generate", "--target", str(folder), "--prompt", "w1", "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer files" in err and "prompt is empty" not in err


# ------------------------------------------------------------------ 4. non-finite weights


def test_non_finite_drafter_and_head_weights_are_refused_at_load(root, tmp_path):
    target = load_target(root / "target", dtype="fp32")
    save_drafter(init_drafter(target, block_size=4).model, tmp_path / "d")
    weights = tmp_path / "d" / "model.safetensors"
    state = load_file(str(weights))
    state["fc.weight"] = torch.full_like(state["fc.weight"], float("nan"))
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="NaN or infinite.*fc.weight"):
        load_drafter(tmp_path / "d", target)
    # a local head folder with an infinite weight is refused by attach-local-head
    from blockdraft.checkpoints import save_local_head
    from blockdraft.drafters.local_head import LocalHead, LocalHeadConfig, UnigramPrior

    save_drafter(init_drafter(target, block_size=4).model, tmp_path / "clean")
    head = LocalHead(LocalHeadConfig(variant="markov", vocab_size=target.vocab_size, rank=8, block_size=8))
    with torch.no_grad():
        next(head.parameters()).fill_(float("inf"))
    save_local_head(tmp_path / "lh", head, UnigramPrior.from_counts(torch.ones(target.vocab_size)))
    assert main(["attach-local-head", "--target", str(root / "target"), "--drafter", str(tmp_path / "clean"),
                 "--local-head", str(tmp_path / "lh"), "--out", str(tmp_path / "fused")]) == 2
    assert not (tmp_path / "fused").exists()


# ------------------------------------------------------------------ 5. resume identity is the data's content


def test_a_moved_run_folder_resumes_and_changed_data_is_refused(root, tmp_path):
    whole = train(config(root, tmp_path / "whole"))
    train(config(root, tmp_path / "first"), stop_after=2)
    shutil.move(tmp_path / "first", tmp_path / "moved")
    data_copy = tmp_path / "elsewhere.jsonl"
    shutil.copy(root / "data.jsonl", data_copy)  # the same content at another path resumes too
    resumed = train(config(root, tmp_path / "moved", data=str(data_copy)), resume=True)
    for key, tensor in load_file(str(whole / "model.safetensors")).items():
        assert torch.equal(load_file(str(resumed / "model.safetensors"))[key], tensor)
    # other rows behind the same path: refused, with what to do
    train(config(root, tmp_path / "second", data=str(data_copy)), stop_after=2)
    write_chat_jsonl(data_copy, 8, user_words=5, assistant_words=24, vocab=60, seed=99)
    with pytest.raises(ConfigError, match="not the data this run was trained on"):
        train(config(root, tmp_path / "second", data=str(data_copy)), resume=True)


# ------------------------------------------------------------------ 6. one trainer per run folder


def test_a_second_trainer_on_the_same_out_dir_is_refused(root, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with folder_lock(out / LOCK_NAME, what="the run", wait=False):  # another trainer holds the folder
        with pytest.raises(ConfigError, match="in use by another process"):
            train(config(root, out))
    assert not (out / "latest.json").exists()
    train(config(root, out, max_steps=1))  # the lock goes with its holder
    assert (out / "latest.json").exists()


# ------------------------------------------------------------------ 7. bench with a prompt past the context


def test_bench_names_a_prompt_too_long_before_measuring_and_always_reports(root, tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "he.jsonl"
    prompts.write_text("".join(json.dumps({"task_id": f"T/{i}", "prompt": f"w{i} w{i + 1}"}) + "\n" for i in range(2))
                       + json.dumps({"task_id": "T/huge", "prompt": " ".join(["w7"] * 900)}) + "\n")
    argv = ["bench", "--target", str(root / "target"), "--method", "ar", "--dataset", f"humaneval={prompts}",
            "--max-new-tokens", "4", "--dtype", "fp32", "--threads", "1", "--out", str(tmp_path / "b")]
    assert main(argv) == 2
    assert "T/huge" in capsys.readouterr().err and not (tmp_path / "b" / "results.json").exists()
    # a run that fails midway still leaves the report of what results.json holds
    from blockdraft.eval import bench as bench_module

    original = bench_module.measure_prompt

    def failing(dataset, prompt, *args, **kwargs):
        if prompt.id == "T/1":
            raise KeyboardInterrupt
        return original(dataset, prompt, *args, **kwargs)

    monkeypatch.setattr(bench_module, "measure_prompt", failing)
    assert main(argv[:-1] + [str(tmp_path / "c"), "--n", "2"]) == 130
    assert (tmp_path / "c" / "results.json").exists() and (tmp_path / "c" / "report.md").exists()


# ------------------------------------------------------------------ 8. normal permissions


def test_saved_folders_and_checkpoints_get_umask_permissions(root, tmp_path):
    out = tmp_path / "run"
    final = train(config(root, out, max_steps=2))
    folder_mode, file_mode = 0o777 & ~umask(), 0o666 & ~umask()
    for folder in (final, out / "checkpoints" / "step_000002"):
        assert stat.S_IMODE(folder.stat().st_mode) == folder_mode
        assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == file_mode
    assert stat.S_IMODE((out / "checkpoints" / "step_000002" / "train_state.pt").stat().st_mode) == file_mode


# ------------------------------------------------------------------ the Python API


@pytest.mark.parametrize("changes,words", [
    ({"prompt_ids": torch.tensor([[1.0, 2.0]])}, "integer token ids"),
    ({"max_new_tokens": 3.5}, "max_new_tokens"),
    ({"temperature": "0.5"}, "temperature must be a number"),
    ({"temperature": float("inf")}, "finite"),
    ({"top_k": 2.5}, "top_k"),
])
def test_generate_refuses_bad_arguments_by_name(root, changes, words):
    target = load_target(root / "target", dtype="fp32")
    kwargs = {"prompt_ids": torch.tensor([[1, 2, 3]]), "max_new_tokens": 4, **changes}
    with pytest.raises(ConfigError, match=words):
        blockdraft.generate(target, None, kwargs.pop("prompt_ids"), **kwargs)


# ------------------------------------------------------------------ reports and the quickstart


def _tau_one_but_faster(tmp_path, root):
    """A real one-prompt bench (ar + a fresh drafter), edited so the drafter accepted nothing (tau 1)
    yet decoded faster: the noise the issue saw on a loaded 2-core machine."""
    save_drafter(init_drafter(load_target(root / "target", dtype="fp32"), block_size=4).model, tmp_path / "d")
    (tmp_path / "he.jsonl").write_text(json.dumps({"task_id": "T/0", "prompt": "w1 w2"}) + "\n")
    assert main(["bench", "--target", str(root / "target"), "--method", f"dflash:{tmp_path / 'd'}", "--dataset",
                 f"humaneval={tmp_path / 'he.jsonl'}", "--max-new-tokens", "6", "--dtype", "fp32", "--threads", "1",
                 "--out", str(tmp_path / "b")]) == 0
    path = tmp_path / "b" / "results.json"
    results = json.loads(path.read_text())
    ar = next(r for r in results["records"] if r["method"] == "ar")
    for record in results["records"]:
        if record["method"].startswith("dflash"):
            rounds = record["rounds"]
            rounds["emitted"] = [1] * len(rounds["emitted"])
            rounds["accepted"] = [0] * len(rounds["accepted"])
            record["decode_s"] = ar["decode_s"] / 1.1 * (len(record["tokens"]) - 1) / max(1, len(ar["tokens"]) - 1)
    path.write_text(json.dumps(results))
    return results


def test_report_flags_a_speedup_that_contradicts_tau_or_rests_on_few_prompts(root, tmp_path, capsys):
    _tau_one_but_faster(tmp_path, root)
    assert main(["report", str(tmp_path / "b" / "results.json")]) == 0
    report = (tmp_path / "b" / "report.md").read_text()
    assert "Caution" in report and "timing noise, not a gain" in report
    assert "rests on 1 prompt(s)" in report


def test_quickstart_summary_says_when_the_drafter_accepted_nothing(root, tmp_path, capsys):
    from blockdraft.quickstart import write_summary

    results = _tau_one_but_faster(tmp_path, root)
    path = write_summary(tmp_path, results, {"prompt": "T/0", "tokens": 6, "identical": True}, 60.0)
    summary = path.read_text()
    assert "accepted nothing" in summary and "timing noise" in summary and "rests on 1 prompt(s)" in summary


# ------------------------------------------------------------------ the 2026-11-25 probe: API, disks, defaults


def test_a_drafter_object_for_another_target_is_a_named_error(root, tmp_path):
    """generate/generate_batch used to fail inside a matmul or an index (a raw RuntimeError / IndexError)."""
    narrow = load_target(root / "target", dtype="fp32")
    wide = load_target(save_tiny_chat_model(tmp_path / "wide", hidden_size=64, num_layers=4), dtype="fp32")
    drafter = init_drafter(narrow, block_size=4)
    prompt = torch.tensor([[3, 4, 5]])
    with pytest.raises(ConfigError, match="built for another target.*hidden_size 32 vs 64"):
        blockdraft.generate(wide, drafter, prompt, max_new_tokens=4)
    with pytest.raises(ConfigError, match="built for another target"):
        blockdraft.generate_batch(wide, drafter, [prompt, prompt], max_new_tokens=4)
    with pytest.raises(ConfigError, match="built for another target"):
        blockdraft.generate(wide, drafter, prompt, max_new_tokens=4, tree_budget=4)
    assert len(blockdraft.generate(narrow, drafter, prompt, max_new_tokens=4).tokens) == 4
    # a drafter for a vocab-256 target on a vocab-128 one (an IndexError before)
    from blockdraft.tiny import tiny_target

    big, small = tiny_target(vocab_size=256, hidden_size=32), tiny_target(vocab_size=128, hidden_size=32)
    with pytest.raises(ConfigError, match="vocab_size 256 vs 128"):
        blockdraft.generate(small, init_drafter(big, block_size=4), prompt, max_new_tokens=4)
    # the same class, other inputs: a lookup corpus tokenised for another model, stop ids that are not ids
    from blockdraft.drafters.lookup import CorpusIndex, LookupDrafter

    foreign = LookupDrafter(4, corpus=CorpusIndex([[3, 4, 5, 900, 901]]))
    with pytest.raises(ConfigError, match="tokenised for another model"):
        blockdraft.generate(narrow, foreign, prompt, max_new_tokens=4)
    with pytest.raises(ConfigError, match="stop_token_ids must be integers"):
        blockdraft.generate(narrow, None, prompt, max_new_tokens=4, stop_token_ids=["a"])
    with pytest.raises(ConfigError, match="stop_token_ids must be a list"):
        blockdraft.generate_batch(narrow, None, [prompt], max_new_tokens=4, stop_token_ids="</s>")


def test_load_drafter_without_a_target_is_a_named_error(root, tmp_path):
    save_drafter(init_drafter(load_target(root / "target", dtype="fp32"), block_size=4).model, tmp_path / "d")
    with pytest.raises(ConfigError, match=r"load_drafter\(path, target\)"):
        load_drafter(tmp_path / "d", None)
    with pytest.raises(ConfigError, match="load_target takes"):
        load_target(None)
    with pytest.raises(ConfigError, match=r"load_drafter\(path, target\)"):
        load_drafter(5, load_target(root / "target", dtype="fp32"))
    with pytest.raises(ConfigError, match="must be an integer"):
        init_drafter(load_target(root / "target", dtype="fp32"), num_layers="2")


def test_lookup_corpus_index_refuses_empty_and_foreign_documents():
    from blockdraft.drafters.lookup import CorpusIndex

    with pytest.raises(ConfigError, match="holds no text"):
        CorpusIndex([[]])
    with pytest.raises(ConfigError, match="non-negative integers"):
        CorpusIndex([[1, "2"]])
    with pytest.raises(ConfigError, match="outside the target's vocabulary"):
        CorpusIndex([[1, 2, 500]], vocab_size=328)
    index = CorpusIndex([[7], [], [1, 2, 3, 1, 2, 4]])  # a one-token document is shorter than every n-gram
    assert sorted(index.continuations([1, 2], 2, 4)) == [[3, 1], [4]]


def test_target_with_a_nan_weight_is_refused_at_load(root, tmp_path):
    folder = _target_copy(root, tmp_path, "nan")
    state = load_file(str(folder / "model.safetensors"))
    state["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="NaN or infinite.*down_proj"):
        load_target(folder, dtype="fp32")


def test_a_drafter_config_is_checked_against_its_file_before_building(root, tmp_path, monkeypatch):
    """A million layers in config.json is refused by bound and by the file's header, with no layer built."""
    from blockdraft.drafters import dflash as dflash_module

    target = load_target(root / "target", dtype="fp32")
    save_drafter(init_drafter(target, block_size=4).model, tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    built = []
    monkeypatch.setattr(dflash_module.DFlashDraftModel, "__init__",
                        lambda self, *a, **k: built.append(1) or (_ for _ in ()).throw(AssertionError("built")))
    for changes, words in (({"num_hidden_layers": 1000000}, "num_hidden_layers"),
                           ({"num_hidden_layers": 4}, "holds 1 draft layer"),
                           ({"intermediate_size": 10 ** 9}, "intermediate_size"),
                           ({"intermediate_size": 48}, "config.json implies")):
        (tmp_path / "d" / "config.json").write_text(json.dumps({**raw, **changes}))
        with pytest.raises(ConfigError, match=words):
            load_drafter(tmp_path / "d", target)
    assert not built


def test_default_layer_ids_are_valid_on_a_two_layer_target(tmp_path, capsys):
    """The default used to pick the final layer (post-norm) of a 2-layer target and then refuse it."""
    folder = save_tiny_chat_model(tmp_path / "t2", hidden_size=32, num_layers=2)
    assert main(["init-drafter", "--target", str(folder), "--block-size", "4", "--dtype", "fp32",
                 "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [0]
    drafter = init_drafter(load_target(folder, dtype="fp32"), num_layers=2, block_size=4)
    assert max(drafter.config.target_layer_ids) == 0


def test_overrides_after_resume_are_overrides(root, tmp_path, capsys):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(config(root, tmp_path / "run", max_steps=2, save_every=1).to_dict()))
    assert main(["train", "--config", str(recipe), "max_steps=1"]) == 0
    assert main(["train", "--config", str(recipe), "--resume", "max_steps=2"]) == 0
    assert json.loads((tmp_path / "run" / "latest.json").read_text())["step"] == 2
    with pytest.raises(SystemExit):
        main(["train", "--config", str(recipe), "--resume", "--bogus"])


def test_a_read_only_output_is_refused_before_any_work(root, tmp_path, monkeypatch, capsys):
    """As root a chmod cannot make a folder read-only, so os.access answers as on a read-only mount."""
    from blockdraft import files

    locked = tmp_path / "ro"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(files.os, "access",
                        lambda path, mode: False if str(path).startswith(str(locked)) else real_access(path, mode))
    target = str(root / "target")
    (tmp_path / "he.jsonl").write_text(json.dumps({"task_id": "T/0", "prompt": "w1 w2"}) + "\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "w1 w2"}) + "\n")
    commands = [
        ["init-drafter", "--target", target, "--block-size", "4", "--out", f"{locked}/d"],
        ["train", "--config", str(_recipe(root, tmp_path)), f"out_dir={locked}/run"],
        ["bench", "--target", target, "--method", "ar", "--dataset", f"humaneval={tmp_path / 'he.jsonl'}",
         "--dtype", "fp32", "--out", f"{locked}/b"],
        ["cache-features", "--target", target, "--data", str(root / "data.jsonl"), "--block-size", "4",
         "--max-length", "96", "--dtype", "fp32", "--out", f"{locked}/c"],
        ["regen", "--target", target, "--prompts", str(tmp_path / "p.jsonl"), "--n", "1", "--out",
         f"{locked}/r.jsonl"],
    ]
    for argv in commands:
        capsys.readouterr()
        assert main(argv) == 2, argv
        assert "cannot be written" in capsys.readouterr().err, argv
    assert list(locked.iterdir()) == []


def _recipe(root, tmp_path):
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(config(root, tmp_path / "unused", max_steps=1).to_dict()))
    return path


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_a_named_error_and_leaves_no_partial_files(root, tmp_path, monkeypatch, capsys):
    import safetensors.torch

    from blockdraft.files import write_json_atomic
    from blockdraft.train import checkpoint

    # a checkpoint's optimizer state: torch.save writes part of the file, then the disk is full
    def partial_save(obj, path, *args, **kwargs):
        open(path, "wb").write(b"PK\x03\x04 half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", partial_save)
    assert main(["train", "--config", str(_recipe(root, tmp_path)), f"out_dir={tmp_path / 'run'}"]) == 2
    assert "the disk is full" in capsys.readouterr().err
    assert not list((tmp_path / "run").glob(".train_state.*"))
    monkeypatch.undo()
    # a drafter's weights (export, init-drafter): safetensors reports the OS error in its own exception
    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **k: (_ for _ in ()).throw(
        safetensors.SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                    "message: \"No space left on device\" })")))
    from blockdraft.checkpoints import dflash as dflash_checkpoints

    monkeypatch.setattr(dflash_checkpoints, "save_file", safetensors.torch.save_file)
    assert main(["init-drafter", "--target", str(root / "target"), "--block-size", "4",
                 "--out", str(tmp_path / "d")]) == 2
    assert "the disk is full" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob(".d.*"))
    # results.json and plots: no `.results.json.partial`, no 0-byte file
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(ConfigError, match="the disk is full"):
        write_json_atomic(tmp_path / "results.json", {"a": 1}, fsync=True)
    assert list(tmp_path.glob("*results.json*")) == []


def test_a_disk_error_anywhere_else_is_named_by_the_cli(root, tmp_path, monkeypatch, capsys):
    from blockdraft.data import regen as regen_module

    monkeypatch.setattr(regen_module, "regen", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system", str(tmp_path / "r.jsonl"))))
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "w1 w2"}) + "\n")
    assert main(["regen", "--target", str(root / "target"), "--prompts", str(tmp_path / "p.jsonl"), "--n", "1",
                 "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "read-only" in err and "Traceback" not in err


def test_a_short_disk_is_refused_before_the_work(root, tmp_path, monkeypatch, capsys):
    """Drafter saves, exports and training runs count the bytes they will write (tensors, AdamW's moments,
    the checkpoints kept) and refuse a file system without that room by name, before writing anything."""
    from blockdraft.files import shutil as files_shutil

    real = files_shutil.disk_usage
    free = {"bytes": 10 << 10}

    def disk_usage(path):
        usage = real(path)
        return type(usage)(usage.total, usage.used, free["bytes"])

    monkeypatch.setattr(files_shutil, "disk_usage", disk_usage)
    init = ["init-drafter", "--target", str(root / "target"), "--block-size", "4", "--dtype", "fp32"]
    assert main(init + ["--out", str(tmp_path / "d")]) == 2
    assert "not enough free disk to write" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob(".d.*"))
    # the run is refused at setup, before its first step: no checkpoint, no metrics
    assert main(["train", "--config", str(_recipe(root, tmp_path)), f"out_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "not enough free disk to train into" in err and "optimizer state" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    # the disk fills during the run: the next checkpoint is refused before a byte of it is written
    def filling(path):
        usage = disk_usage(path)
        free["bytes"] = 10 << 10  # full after the run's check at setup
        return usage

    free["bytes"] = 1 << 40
    monkeypatch.setattr(files_shutil, "disk_usage", filling)
    assert main(["train", "--config", str(_recipe(root, tmp_path)), f"out_dir={tmp_path / 'run2'}"]) == 2
    err = capsys.readouterr().err
    assert "not enough free disk to write the step-1 checkpoint" in err and "--resume" in err, err
    assert not list((tmp_path / "run2").glob(".train_state.*")) and not (tmp_path / "run2" / "latest.json").exists()
    # an export of a drafter written while the disk had room
    free["bytes"] = 1 << 40
    monkeypatch.setattr(files_shutil, "disk_usage", disk_usage)
    assert main(init + ["--out", str(tmp_path / "d")]) == 0
    free["bytes"] = 10 << 10
    assert main(["export", str(tmp_path / "d"), "--for", "zlab", "--out", str(tmp_path / "e")]) == 2
    assert "not enough free disk to write" in capsys.readouterr().err
    assert not (tmp_path / "e").exists() and not list(tmp_path.glob(".e.*"))
