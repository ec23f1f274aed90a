"""The runtimes: the processor, the sink, the workers and analytics, each a package of its own."""
