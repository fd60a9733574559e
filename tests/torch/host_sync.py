"""A guard that makes every host read of a torch tensor raise: what a CUDA graph capture cannot hold (on the GPU
the capture fails there), caught on the CPU. Patches the Python-level ways a tensor reaches the host."""

from contextlib import contextmanager

import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__")


class HostRead(AssertionError):
    pass


@contextmanager
def no_host_reads():
    """Within: tensor.item / tolist / cpu / numpy, bool / int / float / index of a tensor and np.asarray(tensor)
    raise HostRead naming the read."""
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def refuse(name):
        def read(self, *args, **kwargs):
            raise HostRead(f"host read in a graphed step: Tensor.{name}")

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


class GuardedSteps:
    """``backend.StaticSteps`` (graphs=True off CUDA: the graphed code run eagerly) with every replay under
    ``no_host_reads``: the code a CUDA graph would capture, checked for host reads."""

    def __init__(self):
        self.replays = []

    def capture(self, key, step, state) -> bool:
        return False

    def replay(self, key, step, state):
        self.replays.append(key)
        with no_host_reads():
            return step()

    def clear(self) -> None:
        pass
