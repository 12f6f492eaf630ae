"""Build a tiny Llama model directory offline, deterministically: `python build_tiny_model.py KIND OUT`.

Runs under the real vLLM's interpreter (it needs torch, safetensors, tokenizers). KIND:
  target        LlamaForCausalLM with random weights (seed 0)
  drafter       the same architecture and tokenizer, other random weights (seed 1): a drafter
                that never agrees with the target
  unknown-arch  the target's files, but config.json names an architecture vLLM does not know

The tokenizer is a byte-level BPE trained on corpus.txt beside this file (text the repo ships,
so every machine trains the same tokenizer.json). Sizes are the smallest the CPU build of
vLLM 0.32.0 accepts: head_dim 32 (hidden 128 over 4 heads), 2 KV heads, 2 layers, vocab 2048,
1024 positions. The model serves a chat template too, so /v1/chat/completions works.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB = 2048
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")
SEEDS = {"target": 0, "drafter": 1, "unknown-arch": 0}


def tokenizer_files(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(HERE / "corpus.txt")], trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 1024,
        "chat_template": CHAT_TEMPLATE}, indent=1) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}) + "\n")


def weights(out, seed):
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    c = CONFIG
    h, i, kv = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"]
    head_dim = h // c["num_attention_heads"]

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).contiguous()

    tensors = {"model.embed_tokens.weight": rand(VOCAB, h), "model.norm.weight": torch.ones(h),
               "lm_head.weight": rand(VOCAB, h)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        tensors.update({
            p + "self_attn.q_proj.weight": rand(h, h),
            p + "self_attn.k_proj.weight": rand(kv * head_dim, h),
            p + "self_attn.v_proj.weight": rand(kv * head_dim, h),
            p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(i, h),
            p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        })
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def build(kind, out):
    out.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG)
    if kind == "unknown-arch":
        config["architectures"] = ["FooBarForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}) + "\n")
    tokenizer_files(out)
    weights(out, SEEDS[kind])


if __name__ == "__main__":
    kind, out = sys.argv[1], Path(sys.argv[2])
    if kind not in SEEDS:
        sys.exit("kind must be one of %s" % ", ".join(SEEDS))
    build(kind, out)
