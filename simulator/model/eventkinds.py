"""The kinds of a simulated run's events, in the order the engine handles events of one instant."""

ARRIVE, START, MOVE, RESUME, DEFRAG, END, FAIL, REPAIR, REQUEUE, RELEASE = range(10)
