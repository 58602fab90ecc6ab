"""The CUDA-IPC transport of TokenRing's lanes (TOKENRING_XDIT_TRANSPORT=ipc).

- driver.py: the CUDA driver calls it needs (cuda-bindings): IPC memory, stream write/wait value;
- protocol.py: flag-word layout, message packing, inbox growth (pure host logic);
- state.py: one process's IPC state per ring group (flag pages, inboxes, streams, health);
- lanes.py: the IPC lanes (the lane contract of comm/lanes.py) built on it.
"""

from .lanes import IpcLane, ipc_finished, ipc_lanes

__all__ = ["IpcLane", "ipc_finished", "ipc_lanes"]
