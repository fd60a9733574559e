"""A policy whose choice takes simulated host time (the held-choice tests of the engine loop and the server)."""

from flashspec.adaptive import AdaptivePolicy


class SlowChoice(AdaptivePolicy):
    """A policy whose choice takes ``host_s`` of the simulated clock's host time (``clock.now``)."""

    def __init__(self, *args, clock, host_s, **kw):
        super().__init__(*args, **kw)
        self.clock, self.host_s, self.calls = clock, host_s, 0

    def choose(self, rows, where=None, size=None):
        self.clock.now += self.host_s
        self.calls += 1
        return super().choose(rows, where, size)
