"""Tiny random chat models with byte-level BPE tokenizers, as local folders or as a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_SPLIT

from blockdraft.tiny import tiny_config

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if enable_thinking is defined and not enable_thinking %}/no_think\n{% endif %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = [f"w{i}" for i in range(60)]
SPECIALS = ["<pad>", "<|im_end|>", "<|im_start|>"]  # ids 0, 1 (EOS), 2
EOS_ID = 1


def tiny_tokenizer() -> Tokenizer:
    """Byte-level BPE with Qwen2's pre-tokenizer, what transformers rebuilds for a qwen2 folder or GGUF."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([" ".join(WORDS), "user assistant /no_think"] * 20, trainer)
    return tokenizer


def tiny_chat_model(vocab_size: int, *, seed: int = 0):
    config = tiny_config("qwen2", vocab_size=vocab_size, hidden_size=32, num_layers=2)
    config.eos_token_id, config.pad_token_id, config.bos_token_id = EOS_ID, 0, None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # make EOS likely enough that some answers stop early
        model.lm_head.weight[EOS_ID] += 0.5 * model.lm_head.weight[EOS_ID].abs().mean() + 0.3
    model.generation_config.eos_token_id = EOS_ID
    return model.eval()


def save_tiny_chat_folder(folder: Path) -> Path:
    tokenizer = tiny_tokenizer()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<|im_end|>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(folder)
    tiny_chat_model(tokenizer.get_vocab_size()).save_pretrained(folder)
    return folder


def write_tiny_gguf(path: Path):
    """The tiny chat model as an F32 qwen2 GGUF (llama.cpp tensor names), and the model it came from."""
    import gguf

    tokenizer = tiny_tokenizer()
    model = tiny_chat_model(tokenizer.get_vocab_size())
    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token in SPECIALS else 1 for token, _ in vocab])
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                   "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                   "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
                   **{f"self_attn.{x}_proj.{kind}": f"attn_{x}.{kind}" for x in "qkv" for kind in ("weight", "bias")}}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            gguf_name = f"blk.{index}.{layer_names[rest]}"
        else:
            gguf_name = names[name]
        writer.add_tensor(gguf_name, tensor.detach().float().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tiny_chat_model(folder, arch: str = "qwen3", *, seed: int = 0, hidden_size: int = 32,
                         num_layers: int = 3, words: int = 60):
    """Write a tiny random causal LM with a byte-level BPE tokenizer and a chat template to `folder`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<|im_end|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    vocabulary = " ".join(f"w{i}" for i in range(words))
    tokenizer.train_from_iterator([vocabulary, "user assistant def return print"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<|im_end|>",
                                   chat_template=TINY_CHAT_TEMPLATE)
    fast.save_pretrained(folder)
    # Leave spare embedding rows beyond the tokenizer, as real checkpoints do (a default mask token).
    config = tiny_config(arch, vocab_size=tokenizer.get_vocab_size() + 8, hidden_size=hidden_size,
                         num_layers=num_layers)
    config.eos_token_id, config.pad_token_id, config.bos_token_id = 1, 0, None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = 1
    model.save_pretrained(folder)
    return folder
