"""TokenRing as the ring dimension of yunchang USP and xDiT.

Importing this package is cheap (no torch, no host library): the `.pth` bootstrap imports it in
every interpreter. The public names below load their modules on first use.

Package map: config.py (RingConfig, the environment), ring/ (the algorithm, host-agnostic),
hosts/ (yunchang / xDiT contracts -> ring API), patches/ (the one patch table and its sets),
tools/ (CLI, compare, demo, launcher, pipelines).
"""

__version__ = "0.1.0"

__all__ = [
    "token_ring_attn",
    "token_ring_attn_func",
    "token_ring_attn_qkvpacked_func",
    "setup_token_ring_group",
    "shard",
    "unshard",
    "RingConfig",
    "install",
    "uninstall",
    "installed_patches",
    "calls_by_host",
    "__version__",
]

_LAZY = {
    "token_ring_attn": "tokenring_xdit.ring.api",
    "token_ring_attn_func": "tokenring_xdit.ring.api",
    "token_ring_attn_qkvpacked_func": "tokenring_xdit.ring.api",
    "setup_token_ring_group": "tokenring_xdit.ring.comm",
    "shard": "tokenring_xdit.ring.sharding",
    "unshard": "tokenring_xdit.ring.sharding",
    "RingConfig": "tokenring_xdit.config",
    "install": "tokenring_xdit.patches",
    "uninstall": "tokenring_xdit.patches",
    "installed_patches": "tokenring_xdit.patches",
    "calls_by_host": "tokenring_xdit.hosts.calls",
}


def __getattr__(name: str):
    # No typing/importlib at module level: this file runs at every interpreter start-up.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenring_xdit' has no attribute {name!r}")
