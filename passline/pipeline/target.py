"""Target: what passes may know of the machine a graph will run on.

Passes decide from the graph and from these facts only (never from a benchmark's shape): how many
streaming multiprocessors a GPU has, and whether kernels run interpreted on the CPU, where a kernel's
cost grows with its number of programs instead of shrinking with them. The dynamo backend makes one
per compiled graph (`Target.of(graph)`) and hands it to every pass as `ctx.target`.
"""
from __future__ import annotations

import attrs
import torch


@attrs.frozen
class Target:
    """device: "cuda" or "cpu"; sms: the GPU's streaming multiprocessors (0 when not a GPU);
    interpreted: kernels run on the CPU (Triton's interpreter or the reference backend), so splitting
    work over more programs only adds cost."""

    device: str = "cpu"
    sms: int = 0
    interpreted: bool = True

    def __attrs_post_init__(self):
        if self.sms < 0:
            raise ValueError(f"a target has no negative SM count ({self.sms})")
        if self.device == "cuda" and (self.sms == 0 or self.interpreted):
            raise ValueError("a CUDA target runs compiled kernels on its SMs: give sms > 0, interpreted=False")

    @classmethod
    def cpu(cls) -> Target:
        return cls()

    @classmethod
    def cuda(cls, index: int | None = None) -> Target:
        """The GPU `index` (default: the current one) as a target."""
        index = torch.cuda.current_device() if index is None else index
        return cls("cuda", torch.cuda.get_device_properties(index).multi_processor_count, False)

    @classmethod
    def of(cls, graph) -> Target:
        """The target a graph's buffers live on: a GPU when any buffer is on CUDA (the backends run such a
        graph's kernels there), else the CPU."""
        return cls.of_devices(b.layout.device for b in graph.buffers().values())

    @classmethod
    def of_devices(cls, devices) -> Target:
        """The first CUDA device among `devices` (torch.device), else the CPU."""
        cuda = sorted({d for d in devices if d.type == "cuda"}, key=lambda d: d.index or 0)
        return cls.cuda(cuda[0].index) if cuda and torch.cuda.is_available() else cls.cpu()

    def __str__(self) -> str:
        return f"cuda ({self.sms} SMs)" if self.device == "cuda" else "cpu (interpreted)"
