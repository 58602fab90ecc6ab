"""python -m tokenring_xdit.tools.compare = tokenring-xdit compare."""

import sys

from ..cli import console_main

console_main(["compare", *sys.argv[1:]])
