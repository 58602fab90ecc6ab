"""Old path of the compare job, kept for one release: `python -m tokenring_xdit.compare`
still runs `tokenring-xdit compare`; `import tokenring_xdit.compare` gives tools.compare."""

import sys

if __name__ == "__main__":
    from tokenring_xdit.tools.cli import main

    sys.exit(main(["compare", *sys.argv[1:]]))
else:
    import importlib

    sys.modules[__name__] = importlib.import_module("tokenring_xdit.tools.compare")
