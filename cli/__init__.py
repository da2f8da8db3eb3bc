"""``wfjobs``, the command line: :mod:`cli.main` parses and runs the verbs."""
