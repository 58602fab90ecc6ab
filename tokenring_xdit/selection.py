"""Old path, kept for one release: `tokenring_xdit.selection` is
`tokenring_xdit.hosts.selection` (the same module object, so its state is shared)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("tokenring_xdit.hosts.selection")
