"""TokenRing, host-agnostic: schedules, lanes, merge, kernels, the loops and their API.

Nothing here imports from hosts/, patches/ or tools/ (a test checks it). Importing the package
imports no torch: the names below load their modules on first use, so the planner can read the
schedule tables (`ring.schedules`, pure Python) without torch.
"""

# public name -> the module (of this package) that defines it
_LAZY = {
    "token_ring_attn": "api",
    "token_ring_attn_func": "api",
    "token_ring_attn_qkvpacked_func": "api",
    "add_attention_sink": "merge.sink",
    "setup_token_ring_group": "comm",
    "COUNTERS": "comm",
    "Split": "split.value",
    "make_split": "split.sharding",
    "shard": "split.sharding",
    "unshard": "split.sharding",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
