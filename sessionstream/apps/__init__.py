"""The apps: the command line, the HTTP gateway and the demo."""
