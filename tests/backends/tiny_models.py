"""Run inside the engine environment: build tiny random decoders of each supported family
(and one unsupported), reusing the default model's tokenizer files."""

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

tokenizer_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
common = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
configs = {
    "llama": LlamaConfig(**common),
    "qwen2": Qwen2Config(**common),
    "mistral": MistralConfig(**common),
    "gpt2": GPT2Config(vocab_size=49152, n_embd=64, n_layer=4, n_head=4),
}
for name, config in configs.items():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    target = out / name
    model.save_pretrained(target)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer_dir / f, target / f)
print("ok")
