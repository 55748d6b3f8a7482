"""The ``tao`` console script: ``tao hook …`` before anything heavy is imported.

``tao hook <harness>`` runs once per agent tool call, so it must start in a few tens of
milliseconds; :mod:`shared.cli.main` imports the planner, numba and numpy (about half a
second). This entry point looks at the first argument and hands ``hook`` to the stdlib-only
:mod:`shared.harness.hookclient`; everything else goes to :func:`shared.cli.main.main`.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    """Run ``tao`` with ``sys.argv``; returns the exit code."""
    argv = sys.argv[1:]
    if argv[:1] == ["hook"]:
        from shared.harness.hookclient import run_hook

        return run_hook(argv[1:])
    from shared.cli.main import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
