"""The pure core: the decider, its state and timers. No I/O, no settings."""
