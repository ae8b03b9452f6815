"""An in-process stand-in for a SparkContext: partitions are a list, a job
calls the task on each partition's iterator in this process. It runs the
spark engine's driver loops and task code without a JVM (the real thing is
tested in test_spark*.py); ``install`` makes the engine use it."""


class FakeRDD:
    def __init__(self, items, slices):
        self.parts = [items[i * len(items) // slices:(i + 1) * len(items) // slices]
                      for i in range(slices)]

    def persist(self):
        return self

    def unpersist(self):
        return self


class FakeBroadcast:
    def __init__(self, value):
        self.value = value

    def destroy(self, blocking=False):
        pass


class FakeContext:
    master = "fake"

    def __init__(self):
        self.jobs = 0

    def parallelize(self, items, slices):
        return FakeRDD(list(items), slices)

    def broadcast(self, value):
        return FakeBroadcast(value)

    def runJob(self, rdd, func, partitions=None):
        self.jobs += 1
        out = []
        for p in range(len(rdd.parts)) if partitions is None else partitions:
            out.extend(func(iter(rdd.parts[p])))
        return out

    def setJobGroup(self, *args, **kwargs):
        pass

    def cancelJobGroup(self, group):
        pass


def install(monkeypatch) -> FakeContext:
    from monsoon.engines.spark import session

    sc = FakeContext()
    monkeypatch.setattr(session, "session_for", lambda master, workers: (sc, False))
    return sc
