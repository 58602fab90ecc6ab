"""Put this folder first on PYTHONPATH to force the lanes' batch_isend_irecv fallback in every
process of a run, spawned ranks and torchrun workers included (they inherit PYTHONPATH): the
"off" side of the direct-issue before/after runs. Not product code; nothing imports it otherwise."""

import tokenring_xdit.ring.comm.lanes as _lanes

_lanes.DIRECT_P2P = False
