"""The ``monsoon`` command's entry point, outside the package on purpose.

Importing ``monsoon`` loads NumPy, torch and the rest, which takes a second
or more on a loaded machine. A Ctrl-C in that window would land inside an
extension module's import and print a long traceback (NumPy's says "bad
install"), and nothing has run yet. So a SIGINT that arrives while the
package loads is held, and once it has loaded the command ends with the
usual interrupted line and exit code 130, having run nothing. From then on
``monsoon.cli.main`` handles Ctrl-C as documented (a run stops cleanly and
writes its checkpoint).
"""
import signal
import sys


def main() -> int:
    held = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread: nothing to hold
        previous = None
    try:
        from monsoon.cli import main as run
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if held:
        print("monsoon: interrupted while starting; nothing ran", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
