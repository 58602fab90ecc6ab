"""Adapters that plug TokenRing into libraries people train with (optional dependencies).

Each module here imports its library only when used; importing `tokenring_xdit` or
`tokenring_xdit.integrations` imports none of them (tests/unit/test_architecture.py checks it).
`tokenring_xdit.integrations.transformers`: `attn_implementation="token_ring"` for transformers
models, a batch sharder and a loss over all ranks' tokens.
"""
