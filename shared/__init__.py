"""TAO common code: wire contracts, the pure core, and (later) the service shell helpers."""
