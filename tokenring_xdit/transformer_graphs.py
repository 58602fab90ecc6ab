"""Old path, kept for one release: `tokenring_xdit.transformer_graphs` is
`tokenring_xdit.hosts.transformer_graphs` (the same module object, so its state is shared)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("tokenring_xdit.hosts.transformer_graphs")
