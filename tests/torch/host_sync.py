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
    ``no_host_reads``, and refusing a step that changes Python state of the backend, its sequences or its drafts
    (an attribute rebound: a CUDA-graph replay runs no Python, so it would happen at capture only)."""

    def __init__(self, backend):
        self.backend, self.replays = backend, []

    def capture(self, key, step, state) -> bool:
        return False

    def replay(self, key, step, state):
        self.replays.append(key)
        objects = [self.backend, self.backend.seqs, *self.backend.drafts]
        before = [dict(vars(o)) for o in objects]
        with no_host_reads():
            out = step()
        missing = object()
        for o, was in zip(objects, before):
            now = vars(o)
            changed = sorted(k for k in {*was, *now} if now.get(k, missing) is not was.get(k, missing))
            if changed:
                raise HostRead(f"a graphed step rebound {type(o).__name__}.{', '.join(changed)} (host state)")
        return out

    def clear(self) -> None:
        pass
