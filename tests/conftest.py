import os

# Patch failures must fail tests, not degrade to a logged warning.
os.environ.setdefault("TOKENRING_XDIT_STRICT", "1")
