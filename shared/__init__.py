"""TAO's own code below the services, imported as ``shared.*`` by every service and the CLI.

Layers, each importing only those before it (``scripts/import_graph.py`` checks it in CI):
``contracts`` (the wire messages) < ``core`` and ``harness`` (pure: the algorithm, the harness
mappers) < ``infra``, ``sim`` and ``trace`` (NATS, Redis, the simulator, trace readers) <
``services`` (beside this package) < ``cli``. This package is part of the product and must
sit at the repository's top level. It is not the ``shared`` folder of briefs that may lie
*beside* a checkout (design notes, fixtures): the project never imports that one.
"""
