"""TokenRing as the ring dimension of yunchang USP and xDiT.

Importing this package is cheap (no torch, no host library): the `.pth` bootstrap imports it in
every interpreter. The public names below load their modules on first use.
"""

__version__ = "0.1.0"

__all__ = [
    "token_ring_attn",
    "setup_token_ring_group",
    "install",
    "uninstall",
    "installed_patches",
    "__version__",
]

_LAZY = {
    "token_ring_attn": "tokenring_xdit.ring.attention",
    "setup_token_ring_group": "tokenring_xdit.ring.comm",
    "install": "tokenring_xdit.patches",
    "uninstall": "tokenring_xdit.patches",
    "installed_patches": "tokenring_xdit.patches",
}


def __getattr__(name: str):
    # No typing/importlib at module level: this file runs at every interpreter start-up.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenring_xdit' has no attribute {name!r}")
