"""Stand-in for vLLM's OffloadingConnectorStats: counters summed, gauges the latest."""


class OffloadingConnectorStats:
    def __init__(self):
        self.counters = {}
        self.gauges = {}

    def increase_counter(self, name, value=1, labelvalues=()):
        key = (name, tuple(labelvalues))
        self.counters[key] = self.counters.get(key, 0) + value

    def set_gauge(self, name, value, labelvalues=()):
        self.gauges[(name, tuple(labelvalues))] = value

    def is_empty(self):
        return not self.counters and not self.gauges
