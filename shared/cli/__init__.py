"""The ``tao`` command line (entry point :func:`shared.cli.main.main`).

Nothing is re-exported here, so ``python -m shared.cli.main`` runs without importing its own
module twice.
"""
