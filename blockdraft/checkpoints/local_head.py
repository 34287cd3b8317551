"""Standalone DeLS-Spec local head folders: `config.json` (format `blockdraft-local-head`) +
`model.safetensors` with the head's keys unprefixed plus `prior.log_probs`; and attaching one
to a drafter from its folder. (Attached to a drafter, the head is saved with it as a slot head.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..config import LOCAL_HEAD_FORMAT, ConfigError
from ..drafters.local_head import (DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_SMOOTHING, DeLSFusionHead,
                                   LocalHead, LocalHeadConfig, UnigramPrior, attach_fusion_head)
from ..files import MAX_JSON_BYTES, atomic_write_folder, check_input_folder, parse_json, read_text
from .dflash import CONFIG_NAME, WEIGHTS_NAME, load_strict, state_bytes


def save_local_head(out_dir: str | Path, head: LocalHead, prior: UnigramPrior, *,
                    extra: Mapping[str, Any] | None = None) -> None:
    """config.json + model.safetensors (head keys unprefixed, `prior.log_probs`), written atomically."""
    if prior.vocab_size != head.config.vocab_size:
        raise ConfigError(f"the prior covers {prior.vocab_size} tokens, the local head {head.config.vocab_size}")
    state = {key: tensor.detach().float().contiguous().cpu() for key, tensor in head.state_dict().items()}
    state["prior.log_probs"] = prior.log_probs.detach().float().contiguous().cpu()
    config = {"format": LOCAL_HEAD_FORMAT, "format_version": 1, **head.config.to_dict(), "prior": prior.describe(),
              **(extra or {})}

    def write(folder: Path) -> None:
        (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})

    atomic_write_folder(Path(out_dir), write, need_bytes=state_bytes(state))


def load_local_head(path: str | Path) -> tuple[LocalHead, UnigramPrior]:
    """A folder written by `save_local_head` -> (local head, prior), float32 on the CPU."""
    folder = Path(path)
    if not (folder / CONFIG_NAME).is_file():
        raise ConfigError(f"{folder} is not a local head folder (no config.json); write one with "
                          f"`blockdraft train-local-head`")
    check_input_folder(folder, what="local head folder")
    raw = parse_json(read_text(folder / CONFIG_NAME, what="local head config", max_bytes=MAX_JSON_BYTES),
                     what=f"{folder / CONFIG_NAME} (the local head is corrupt: train it again with `blockdraft "
                          "train-local-head`)")
    if not isinstance(raw, dict) or raw.get("format") != LOCAL_HEAD_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else f"none: a JSON {type(raw).__name__}"
        raise ConfigError(f"{folder / CONFIG_NAME} is not a local head config (format {found!r}, "
                          f"expected {LOCAL_HEAD_FORMAT!r})")
    head = LocalHead(LocalHeadConfig.from_dict(raw))
    prior_spec = raw.get("prior") or {}
    try:
        prior = UnigramPrior(head.config.vocab_size, smoothing=float(prior_spec.get("smoothing", DEFAULT_SMOOTHING)),
                             num_tokens=int(prior_spec.get("num_tokens", 0)))
    except ConfigError:
        raise
    except (AttributeError, TypeError, ValueError, OverflowError) as err:
        raise ConfigError(f"{folder / CONFIG_NAME}: its prior entry {raw.get('prior')!r} is malformed ({err}); the "
                          "local head is corrupt: train it again with `blockdraft train-local-head`") from None
    try:
        state = load_file(str(folder / WEIGHTS_NAME))
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"{folder / WEIGHTS_NAME} is missing or unreadable ({err})") from None
    head_state = {k: v for k, v in state.items() if not k.startswith("prior.")}
    missing, unexpected = load_strict(head, head_state)
    m, u = load_strict(prior, {k[len("prior."):]: v for k, v in state.items() if k.startswith("prior.")}, "prior.")
    if missing + m or unexpected + u:
        raise ConfigError(f"{folder / WEIGHTS_NAME} does not match its config.json: missing {missing + m}, "
                          f"unexpected {unexpected + u}")
    return head.eval(), prior.eval()


def fusion_head(local_head: str | Path | tuple[LocalHead, UnigramPrior], *, alpha: float = DEFAULT_ALPHA,
                beta: float = DEFAULT_BETA) -> DeLSFusionHead:
    """A fixed-α/β fusion head from a local head folder or a (local head, prior) pair."""
    short, prior = load_local_head(local_head) if isinstance(local_head, (str, Path)) else local_head
    return DeLSFusionHead(short, prior, alpha=alpha, beta=beta)


def attach_local_head(drafter, local_head: str | Path | tuple[LocalHead, UnigramPrior] | DeLSFusionHead, *,
                      alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, **options):
    """DeLS-Spec on a trained drafter: `attach_fusion_head` with the fusion head built from `local_head`,
    a folder from `blockdraft train-local-head`, a (LocalHead, UnigramPrior) pair, or a ready fusion
    head (then alpha/beta are ignored). Extra keyword arguments go to `HeadedDrafter`."""
    head = local_head if isinstance(local_head, DeLSFusionHead) else fusion_head(local_head, alpha=alpha, beta=beta)
    return attach_fusion_head(drafter, head, **options)
