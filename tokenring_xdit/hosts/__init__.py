"""Host adapters: each turns one host library's attention contract into the ring API.

yunchang.py (ring-function contract of `ring_flash_attn_func`), xdit.py (xDiT's USP ring step and
`xFuserLongContextAttention`), selection.py (which ring xDiT runs), transformer_graphs.py
(whole-transformer CUDA graphs for xDiT). They import the ring, never patches/ or tools/.
"""
