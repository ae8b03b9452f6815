"""Imported by the fork server that forks the local engine's workers,
before anything else it preloads (``processes.start_context``): from then
on the fork server dies with the monitor that started it
(``lifecycle.tie_fork_server``). Imported anywhere else, it does nothing:
only the fork server's environment names its monitor."""
from .lifecycle import tie_fork_server

tie_fork_server()
