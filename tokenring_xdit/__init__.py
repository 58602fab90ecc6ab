"""TokenRing as the ring dimension of yunchang USP and xDiT.

Importing this package is cheap (no torch, no host library): the `.pth` bootstrap imports it in
every interpreter. The public names below load their modules on first use: the ring call and
its split (Split, make_split, shard/unshard, zigzag_positions / shard_positions,
setup_token_ring_group), the ring a host runs (set_ring_impl: xDiT's and diffusers' ring), CPU
mode (enable_cpu_mode), transformers' attention (register_transformers), patching
(install/uninstall).

Package map: config.py (RingConfig, the only reader of the environment; _envflags.py: what the
start-up hook _bootstrap.py shares with it), ring/ (the algorithm, host-agnostic), planner/ (the
cost model `auto` decides with), hosts/ (yunchang / xDiT / diffusers contracts -> ring API, and
which ring a host runs), patches/ (the one patch table and its shims), integrations/
(transformers' attention), tools/ (CLI, compare, demo, launcher, pipelines).
"""

__version__ = "0.1.0"


_LAZY = {
    "token_ring_attn": "tokenring_xdit.ring.api",
    "token_ring_attn_func": "tokenring_xdit.ring.api",
    "token_ring_attn_qkvpacked_func": "tokenring_xdit.ring.api",
    "add_attention_sink": "tokenring_xdit.ring.merge.sink",
    "setup_token_ring_group": "tokenring_xdit.ring.comm",
    "Split": "tokenring_xdit.ring.split.value",
    "make_split": "tokenring_xdit.ring.split.sharding",
    "shard": "tokenring_xdit.ring.split.sharding",
    "unshard": "tokenring_xdit.ring.split.sharding",
    "RingConfig": "tokenring_xdit.config",
    "install": "tokenring_xdit.patches",
    "uninstall": "tokenring_xdit.patches",
    "installed_patches": "tokenring_xdit.patches",
    "calls_by_host": "tokenring_xdit.hosts.calls",
    # (module, its name) where the public name is shorter than the module's own
    "set_ring_impl": ("tokenring_xdit.hosts.selection", "set_xdit_ring_impl"),
    "enable_cpu_mode": "tokenring_xdit.patches.cpu_mode",
    "disable_cpu_mode": "tokenring_xdit.patches.cpu_mode",
    "register_transformers": ("tokenring_xdit.integrations.transformers", "register"),
    "zigzag_positions": "tokenring_xdit.ring.split.sharding",
    "shard_positions": "tokenring_xdit.ring.split.sharding",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    # No typing/importlib at module level: this file runs at every interpreter start-up.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tokenring_xdit' has no attribute {name!r}")
