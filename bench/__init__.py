"""Benchmarks: scripts that print numbers. Run each as `python -m bench.<name>`."""
