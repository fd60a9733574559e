"""A fixed schedule of arms for the loop's policy (tests of both backends): drafts lag and catch up."""


class Cycle:
    """Switches arms in a fixed pattern, so drafts lag and catch up."""

    def __init__(self, pattern):
        self.pattern, self.t = pattern, 0

    def choose(self):
        self.t += 1
        return self.pattern[(self.t - 1) % len(self.pattern)]

    def observe(self, *args):
        pass
