"""The grouped attention against transformers' `sdpa` on an older transformers (5.15, the reference
venv's): max |difference| of the logits of a prefill, a 4-token verify and a one-token step, dynamic
and static caches, a tiny random Llama with 4 query heads on 2. Run from the repository root:

    PYTHONPATH=. .venv-reference/bin/python dev/measurements/compiled-lanes-grouped-2026-12-06/transformers_515_check.py

Printed on 2026-12-06: `5.15.0 dynamic [0.0, 0.0, 0.0]` and `5.15.0 static [0.0, 0.0, 1.49e-08]`
(5.15 repeats the heads at one query row, where the grouped attention folds them).
"""
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from dflash_core import Target
from dflash_core.models.attention import GROUPED_SDPA
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=512)
m = LlamaForCausalLM(cfg).eval()
m.set_attn_implementation("sdpa")
out = {}
for static in (False, True):
    t = Target(m, static_cache=static)
    assert m.config._attn_implementation == GROUPED_SDPA
    with torch.inference_mode():
        t.reset(); a = [t.forward(torch.tensor([list(range(5, 25))]))[0], t.forward(torch.tensor([[40, 41, 42, 43]]))[0], t.forward(torch.tensor([[7]]))[0]]
        m.set_attn_implementation("sdpa")
        t.reset(); b = [t.forward(torch.tensor([list(range(5, 25))]))[0], t.forward(torch.tensor([[40, 41, 42, 43]]))[0], t.forward(torch.tensor([[7]]))[0]]
    print(transformers.__version__, "static" if static else "dynamic", [float((x - y).abs().max()) for x, y in zip(a, b)])
