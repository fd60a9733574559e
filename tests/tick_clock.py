"""A simulated clock for tests that run the real loops, with no simulated backend of their own to advance one."""


class TickClock:
    """Simulated seconds that advance by ``tick`` at every read: host work lasts as many ticks as it reads the clock
    (the same on a quiet machine and a loaded one), and a paced device's spin until its deadline
    (``benchmarks/paced_device.py``'s ``wait_until``) reads it until the deadline is reached. A test installs it as
    ``time.perf_counter`` (what ``flashspec.loop.StepTimer``, the scheduler and the benchmarks read)."""

    def __init__(self, tick: float = 1e-6):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now
