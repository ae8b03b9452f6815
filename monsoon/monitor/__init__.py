"""What watches a run, whatever engine carries it: ``due`` (the schedule of
curve rows, live updates, checkpoints, the no-progress timeout and signal
stops), ``lifecycle`` (no worker outlives its monitor; SIGTERM/SIGINT stop
a run cleanly), ``waiting`` (every wait is bounded), ``processes`` and
``heap`` (starting worker processes on this machine), ``pool`` (the worker
pool a monitor starts, watches and joins, and the lost-worker rule of every
engine), ``tally`` (the workers' end reports summed into the run's
``EngineResult``, the result every engine returns). It imports no engine (``processes.PRELOAD`` names, as strings,
the worker modules its fork server loads once): engines import it, never
the other way."""
