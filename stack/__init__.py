"""The local stack's own tools (not installed with the package): the readiness probe and the
secured profile's credentials."""
