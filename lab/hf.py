"""Any Hugging Face causal LM behind the lab model's interface, so every kata's loop and the reference run on it
unchanged.

    policy = load("Qwen/Qwen2.5-0.5B-Instruct", device)     # a hub name, or a local folder (offline)
    policy(input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V)
    cache = policy.make_cache(); policy(new_ids (N, Lq), attention_mask (N, L_total), cache=cache)
    policy.tokenizer, policy.eos_id, policy.pad_id

What the adapter adds to AutoModelForCausalLM, and why:
- positions from the mask: position_ids = cumsum(mask) - 1, clamped at 0, passed to the model. Without them HF
  numbers the columns 0..L-1, so a left-padded row sits at positions shifted by its pad count: a no-op only up to
  rounding for rotary models, a different input for learned absolute positions (GPT-2).
- PAD distinct from EOS: where the tokenizer has no pad token, or its pad is its EOS, a new `<|pad|>` token is
  added (the embeddings grow only if the new id does not fit). A loop that finds a row's end by `ids == pad` then
  never mistakes padding for an end, nor an end for padding.
- no dropout: every dropout probability is set to 0, so two passes of the same weights give the same numbers
  (the PPO ratio is exactly 1 on the first update), in eval and train mode alike.
- the KV cache is the model's own (a transformers DynamicCache), filled in place by each cached call.
- gradient checkpointing, when asked for: HF applies it only in train mode, so the adapter puts the model in
  train mode for passes with grad and in eval mode otherwise (HF drops the cache in train mode); with dropout at 0
  the two modes compute the same numbers.
- dtype: float32 weights everywhere (AdamW updates of 1e-6 vanish in bf16 weights); on CUDA the trainer computes
  under bf16 autocast, and `frozen_copy()` keeps the KL reference in bf16.

`save_random_llama(folder)` writes a random LlamaForCausalLM and a character tokenizer built with `tokenizers`, to
practise and test offline: `python -m lab.hf random-llama runs/tiny-llama [--size tiny|0.5b]`.

transformers is an optional extra: pip install -e '.[hf]'. Nothing else in lab/ imports this module.
"""
import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn as nn

INSTALL_HINT = "real models need transformers: .venv/bin/pip install -e '.[hf]'"
PAD_TOKEN = "<|pad|>"


def require_transformers():
    """transformers, told to keep quiet: no progress bars or notices between the lines of a live display."""
    try:
        import transformers
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    import huggingface_hub  # its retries of an unreachable hub would print a line each
    huggingface_hub.utils.logging.set_verbosity_error()
    return transformers


class HFPolicy(nn.Module):
    """A causal LM from transformers, called as the lab model is: model(input_ids, attention_mask[, cache])."""

    def __init__(self, model, tokenizer=None, gradient_checkpointing: bool = False):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer  # None for a model that is only called on token ids (the tests' small models)
        self.eos_id, self.pad_id = (tokenizer.eos_token_id, tokenizer.pad_token_id) if tokenizer else (None, None)
        self.checkpointing = gradient_checkpointing
        no_dropout(model)
        model.eval()
        if gradient_checkpointing:  # activation_checkpointing_enable from transformers 5.x, the old name before
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def make_cache(self):
        from transformers import DynamicCache
        return DynamicCache(config=self.model.config)

    def forward(self, input_ids, attention_mask, cache=None):
        N, Lq = input_ids.shape
        Lk = attention_mask.shape[1]                                      # every column seen so far
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, Lk - Lq:]  # (N, Lq) from the mask
        checkpointing = self.checkpointing and torch.is_grad_enabled() and cache is None
        if self.model.training != checkpointing:                          # HF checkpoints only in train mode
            self.model.train(checkpointing)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                         past_key_values=cache, use_cache=cache is not None)
        return out.logits                                                 # (N, Lq, V)

    def frozen_copy(self) -> "HFPolicy":
        """The KL reference: a copy that never takes a step, in bf16 on a GPU (CUDA or a Mac's MPS: half the memory;
        it only scores)."""
        ref = copy.deepcopy(self).requires_grad_(False)
        device = next(self.parameters()).device
        return ref.to(torch.bfloat16) if device.type in ("cuda", "mps") else ref


def no_dropout(model) -> None:
    """Every dropout probability to 0: nn.Dropout modules, and the attention dropout HF reads from each layer."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    for key, value in list(model.config.to_dict().items()):
        if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
            setattr(model.config, key, 0.0)


def load_tokenizer(name: str, **kwargs):
    """The checkpoint's tokenizer with a pad token of its own (never its EOS)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{name}: the tokenizer has no EOS token, so a completion could never end")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return tokenizer


def source_of(name: str) -> tuple:
    """(what to pass to from_pretrained, is it a local folder). A name that reads as a path (./x, /x, ~/x, or
    under a folder that exists here, as runs/x) must be a saved model's folder: it is never sent to the hub."""
    local = Path(name).expanduser()
    if local.exists() or name.startswith((".", "/", "~")) or (local.parent != Path(".") and local.parent.is_dir()):
        if not local.is_dir():
            raise ValueError(f"cannot load the model {name!r}: no such folder")
        if not (local / "config.json").exists():
            raise ValueError(f"cannot load the model {name!r}: a folder without config.json, not a saved model")
        return str(local), True
    return name, False


def load(name: str, device="cpu", *, gradient_checkpointing: bool = False) -> HFPolicy:
    """A hub name or a local folder -> HFPolicy on `device`, float32 weights (see the module docstring). A hub
    model is read from the local cache when it is there (no network at all), else downloaded."""
    require_transformers()
    from transformers import AutoModelForCausalLM
    source, local = source_of(name)

    def read(**kwargs):
        return load_tokenizer(source, **kwargs), AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32,
                                                                                      **kwargs)
    try:
        try:
            tokenizer, model = read(local_files_only=True)
        except OSError:  # a hub model not in the cache yet
            if local:
                raise
            tokenizer, model = read()
    except (OSError, ValueError) as exc:  # no such hub repo, no network, not a causal LM
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot load the model {name!r}: {first}") from None
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:  # the pad token added above needs a row
        model.resize_token_embeddings(len(tokenizer))
    return HFPolicy(model, tokenizer, gradient_checkpointing).to(device)


def encode_prompt(tokenizer, text: str) -> list:
    """A prompt's token ids: the user turn of the tokenizer's chat template, generation prompt included, where the
    tokenizer has one; else the text as the tokenizer encodes it (its BOS included, if it adds one)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


# --------------------------------------------------------------------------------- a random Llama, offline

# The tiny model learns the lab's sum task posed as text in a few CPU seconds; the 0.5B one has Qwen2.5-0.5B's
# shapes (and its vocabulary size, so the logits cost what they cost there) for a GPU's throughput and memory.
SIZES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, max_position_embeddings=4096, vocab_size=151936, tie_word_embeddings=True),
}
CHARS = "0123456789+=-*#?., "   # the tiny tokenizer's characters; any other character reads as <unk>
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def char_tokenizer(chars: str = CHARS, chat_template: str | None = CHAT_TEMPLATE):
    """One token per character, built with `tokenizers`: <unk>, </s> (EOS), the chat roles, then the characters.
    No pad token, as Llama's tokenizers have none: load() adds one."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    specials = ["<unk>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(chars)))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: one token per character
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="</s>",
                                   additional_special_tokens=specials[2:], chat_template=chat_template)


def save_random_llama(folder, size: str = "tiny", seed: int = 0, chat_template: str | None = CHAT_TEMPLATE,
                      chars: str = CHARS) -> Path:
    """A randomly initialised LlamaForCausalLM and its character tokenizer, saved with save_pretrained: a folder
    that load() and AutoModelForCausalLM.from_pretrained read as they read any checkpoint."""
    require_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    tokenizer = char_tokenizer(chars, chat_template)
    shape = {"vocab_size": len(tokenizer), **SIZES[size]}
    config = LlamaConfig(**shape, bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.hf", description="real models for the lab")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("random-llama", help="write a random Llama and its character tokenizer to a folder, to "
                                            "practise with MODEL=FOLDER offline")
    r.add_argument("folder", type=Path, help="where to save it (created; an existing model there is replaced)")
    r.add_argument("--size", choices=list(SIZES), default="tiny",
                   help="tiny (learns the text sum task on a CPU in seconds) or 0.5b (Qwen2.5-0.5B's shapes, "
                        "for a GPU)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    a = p.parse_args(argv)
    try:
        folder = save_random_llama(a.folder, a.size, a.seed)
    except (ImportError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"saved a random {a.size} Llama to {folder}: make train MODEL={folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
