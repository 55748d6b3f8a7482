"""TAO services (telemetry, tools, valuation, planner, gateway, simnode): thin async shells around
``shared.core``. Each will run as ``python -m services.<name>``; they arrive with the services
issue."""
