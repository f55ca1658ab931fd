"""A tiny causal transformer LM with the interface every kata, check and trainer relies on.

    model(input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V)

Positions come from the attention mask (cumsum - 1), and pad keys are masked out of attention, so a
left-padded row scores exactly like the same row unpadded. No dropout: two forward passes of the same
weights give the same numbers, which is what makes the PPO ratio exactly 1 on the first update.

`TinyLM(cfg, dtype=torch.float64)` makes its weights in float64 from the start, rather than casting float32 ones:
torch's float32 random fills take a vectorized path on some CPUs and not on others, so the same seed gives weights
that differ in their last bits from one CPU to the next; its float64 fills agree to within 1e-16.

For fast sampling, `make_cache()` returns a KV cache; `model(new_ids, attention_mask, cache=cache)` then
takes only the new columns while `attention_mask` covers every column seen so far (N, L_total).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 16
    d_model: int = 64      # width; 512 for the GPU check
    n_layer: int = 2       # depth; 8 for the GPU check
    n_head: int = 4
    max_len: int = 64      # longest prompt + completion


class KVCache:
    """Keys and values of every column seen so far, one (k, v) pair per layer, each (N, nh, L, hs)."""

    def __init__(self, n_layer: int):
        self.layers = [None] * n_layer

    def update(self, i: int, k: torch.Tensor, v: torch.Tensor):
        if self.layers[i] is not None:
            k = torch.cat([self.layers[i][0], k], dim=2)  # (N, nh, L_total, hs)
            v = torch.cat([self.layers[i][1], v], dim=2)
        self.layers[i] = (k, v)
        return k, v


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=None):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model, dtype=dtype)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, dtype=dtype)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, dtype=dtype)
        self.ln2 = nn.LayerNorm(cfg.d_model, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model, dtype=dtype), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model, dtype=dtype))

    def forward(self, x, allowed, cache=None, layer=0):
        N, Lq, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(N, Lq, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))  # (N, nh, Lq, hs)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (N, nh, Lk, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])  # (N, nh, Lq, hs)
        x = x + self.proj(y.transpose(1, 2).reshape(N, Lq, D))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig = ModelConfig(), dtype: torch.dtype | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model, dtype=dtype)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model, dtype=dtype)
        self.blocks = nn.ModuleList(Block(cfg, dtype) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, dtype=dtype)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, dtype=dtype)

    def make_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer)

    def forward(self, input_ids, attention_mask, cache=None):
        N, Lq = input_ids.shape
        mask = attention_mask.bool()                                   # (N, Lk) every column seen so far
        Lk = mask.shape[1]
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, Lk - Lq:]   # (N, Lq) positions from the mask
        x = self.tok(input_ids) + self.pos(pos.clamp(max=self.cfg.max_len - 1))  # (N, Lq, D)
        q_idx = torch.arange(Lk - Lq, Lk, device=mask.device)[:, None]  # (Lq, 1)
        k_idx = torch.arange(Lk, device=mask.device)[None, :]           # (1, Lk)
        causal = k_idx <= q_idx                                        # (Lq, Lk)
        # a query sees earlier real keys; it always sees itself, so a pad row never softmaxes over nothing
        allowed = (causal & mask[:, None, :]) | (k_idx == q_idx)       # (N, Lq, Lk)
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, cache, i)
        return self.head(self.ln_f(x))                                 # (N, Lq, V)
