"""The CUDA-IPC transport of TokenRing's lanes (TOKENRING_XDIT_TRANSPORT=ipc).

- driver.py: the CUDA driver calls it needs (cuda-bindings): IPC memory, stream write/wait value;
- protocol.py: flag-word layout, message packing, inbox growth (pure host logic);
- lanes.py: the IPC lanes (the lane contract of comm/lanes.py) and a ring's IPC state.
"""

from .lanes import IpcLane, ipc_finished, ipc_lanes

__all__ = ["IpcLane", "ipc_finished", "ipc_lanes"]
