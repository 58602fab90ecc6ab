"""Old path, kept for one release: `tokenring_xdit.xfuser_cpu` is
`tokenring_xdit.patches.xfuser_cpu` (the same module object, so its state is shared)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("tokenring_xdit.patches.xfuser_cpu")
