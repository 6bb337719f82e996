"""The PyTorch side of the benchmarks: the models of tools/parity/pytorch_parity.py (zt's tensor
layout), with GPT attention through F.scaled_dot_product_attention (flash) so that the baseline
is PyTorch at its best, not the materialised softmax the parity run uses (the encoder's
nn.MultiheadAttention uses SDPA already). Importing this module applies the change."""
import os
import sys

import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import pytorch_parity  # noqa: E402
from pytorch_parity import GPT, Encoder  # noqa: E402,F401


def _sdpa_attention(self, x):
    B, T, C = x.shape
    hs = C // self.nh
    q, k, v = self.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


pytorch_parity.Attention.forward = _sdpa_attention
