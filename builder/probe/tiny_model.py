"""A tiny random causal LM (Qwen2) and byte-level BPE tokenizer, built offline with the image's
own transformers/tokenizers, saved so that any engine can load it from disk."""

from __future__ import annotations

import json
import os

EOS, PAD = "<|endoftext|>", "<|pad|>"
# ChatML's markers, as Qwen's tokenizers define them: verl 0.9's agent loop requires <|im_end|>.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega one two three four five six seven eight nine ten the a of to and in is "
         "for on with as by at from that this it be are was were policy reward rollout gradient token model").split()
PROMPTS = ("the policy gradient of the reward model is", "alpha beta gamma delta epsilon zeta eta theta",
           "one two three four five six seven eight nine", "a rollout of tokens from the model with reward",
           "sigma tau upsilon phi chi psi omega is the end", "it was the token that was in the rollout of it",
           "from this model to that model and to the policy", "kappa lambda mu nu xi omicron pi rho sigma tau")
HIDDEN, LAYERS, HEADS, KV_HEADS, INTER = 128, 2, 2, 1, 256  # head_dim 64: every attention backend has it
# What build() imports, in the order it does (the probe's warm-up imports them ahead of it).
MODULES = ("tokenizers", "transformers", "transformers.models.qwen2.modeling_qwen2")


def _corpus(n: int = 400) -> list[str]:
    import random
    rng = random.Random(0)
    return list(PROMPTS) + [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))) for _ in range(n)]


def build_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD, IM_START, IM_END], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def save_tokenizer(tok, out: str) -> None:
    tok.save(os.path.join(out, "tokenizer.json"))
    # Written by hand, not by save_pretrained: transformers 5 writes "TokenizersBackend", which
    # engines running on transformers 4 cannot load.
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": PAD, "bos_token": None,
           "unk_token": None, "model_max_length": 512, "padding_side": "left", "clean_up_tokenization_spaces": False}
    _write(os.path.join(out, "tokenizer_config.json"), cfg)
    _write(os.path.join(out, "special_tokens_map.json"), {"eos_token": EOS, "pad_token": PAD})


def _write(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def build_model(vocab_size: int, eos_id: int, pad_id: int, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=HIDDEN, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, intermediate_size=INTER, num_hidden_layers=LAYERS,
                      max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=eos_id,
                      pad_token_id=pad_id, bos_token_id=None, rope_theta=10000.0, use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # start from bf16-representable weights so trainer and a bf16 engine agree
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def save_model(model, out: str) -> None:
    model.save_pretrained(out)
    path = os.path.join(out, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    # Both spellings of RoPE: transformers 5 writes rope_parameters, older engines read rope_theta.
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    cfg["rope_theta"] = theta
    cfg.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": theta})
    _write(path, cfg)
    for f in os.listdir(out):  # save_pretrained has written weights with mode 0600
        os.chmod(os.path.join(out, f), 0o644)


def build(out: str, seed: int = 0):
    """-> (model in memory, tokenizers.Tokenizer, eos_id, pad_id); everything saved under out."""
    os.makedirs(out, exist_ok=True)
    tok = build_tokenizer()
    save_tokenizer(tok, out)
    eos, pad = tok.token_to_id(EOS), tok.token_to_id(PAD)
    model = build_model(tok.get_vocab_size(), eos, pad, seed)
    save_model(model, out)
    return model, tok, eos, pad


def prompt_ids(tok, count: int, length: int = 8, offset: int = 0) -> list[list[int]]:
    """Equal-length prompts (no padding anywhere, so every engine sees the same positions)."""
    out = []
    for i in range(count):
        ids = tok.encode(PROMPTS[(i + offset) % len(PROMPTS)] + " " + " ".join(WORDS[i:i + 8])).ids
        out.append(ids[:length])
    return out
