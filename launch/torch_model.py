"""The model of SPEC.md in PyTorch, with SPEC.md's parameter names (a trainer checkpoint loads into
it with load_state_dict(strict=True)); used by torch_load_check.py and torch_step_bench.py.

Runs in the dtype of its parameters (float64 for the load check) or under bf16 autocast (the
step benchmark): RMSNorm computes in fp32 at least, RoPE's table is float64 and is cast to the
activations' dtype.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

# d_model, d_ff, layers, heads (model/config.cpp)
PRESETS = {
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight


def rope(t, cos, sin):
    """Interleaved pairs (t[2j], t[2j+1]) of each head rotated by position; t is (B, H, T, dh)."""
    a, b = t[..., 0::2], t[..., 1::2]
    cos, sin = cos.to(t.dtype), sin.to(t.dtype)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (
            nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        split = lambda t: t.view(B, T, self.h, d // self.h).transpose(1, 2)
        q = rope(split(self.q_proj(x)), cos, sin)
        k = rope(split(self.k_proj(x)), cos, sin)
        y = F.scaled_dot_product_attention(q, k, split(self.v_proj(x)), is_causal=True)
        return self.output_proj(y.transpose(1, 2).reshape(B, T, d))


class FFN(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1, self.w2, self.w3 = (nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False),
                                     nn.Linear(d, f, bias=False))

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, f, h):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.ffn = RMSNorm(d), Attention(d, h), RMSNorm(d), FFN(d, f)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab, d, f, layers, h, ctx):
        super().__init__()
        self.token_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, f, h) for _ in range(layers))
        self.ln_final = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        dh = d // h
        j = torch.arange(dh // 2, dtype=torch.float64)
        ang = torch.arange(ctx, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * j / dh)[None]
        # Not in the state dict (SPEC.md's names only); rope() casts them to the activations' dtype.
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, ids):
        T = ids.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.token_embeddings(ids)
        for b in self.layers:
            x = b(x, cos, sin)
        return self.lm_head(self.ln_final(x))
