"""python -m tokenring_xdit.tools.compare = tokenring-xdit compare."""

import sys

from ..cli import main

sys.exit(main(["compare", *sys.argv[1:]]))
