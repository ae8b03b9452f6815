"""The ``monsoon`` command's entry point, outside the package on purpose.

Importing ``monsoon`` loads NumPy, torch and the rest, which takes a second
or more on a loaded machine. A Ctrl-C in that window would land inside an
extension module's import and print a long traceback (NumPy's says "bad
install"), and a SIGTERM (``timeout``, a batch scheduler) would end the
process with no word, and nothing has run yet. So a SIGINT or SIGTERM that
arrives while the package loads is held, and once it has loaded the command
ends with the usual interrupted line and exit code 130 (SIGINT) or 143
(SIGTERM), having run nothing. From then on ``monsoon.cli.main`` handles
them as documented (a run stops cleanly and writes its checkpoint).
"""
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def main() -> int:
    held, previous = [], {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread: nothing to hold
        pass
    try:
        from monsoon.cli import main as run
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held:
        print("monsoon: interrupted while starting; nothing ran", file=sys.stderr)
        return 128 + held[0]
    return run()


if __name__ == "__main__":
    sys.exit(main())
