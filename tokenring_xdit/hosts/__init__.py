"""Host adapters: each turns one host library's attention contract into the ring API.

yunchang.py (ring-function contract of `ring_flash_attn_func`), xdit.py (xDiT's USP ring step and
long-context ring function), diffusers.py (diffusers' context-parallel attention), selection.py
(which ring xDiT and diffusers run: the sources, `auto` through the planner, the agreed choice,
each host's refusals' helpers), traced_choice.py (that choice under torch.compile),
transformer_graphs.py (whole-transformer CUDA graphs for xDiT), calls.py (calls per host).
They import the ring, the config and (for `auto`) the planner; never patches/ or tools/.
"""
