"""Old home of the training kernels; they are records of `ring/kernels/` now.

Kept only for the names that error messages, docstrings and users' code spell
`tokenring_xdit.ring.backward_kernels.PAIRS` (compiled.py's refusal, api's `*_func` docstring);
new code imports from `tokenring_xdit.ring.kernels`."""

from .kernels import PAIRS, KernelPair, row_delta, select_pair

__all__ = ["KernelPair", "PAIRS", "select_pair", "row_delta"]
