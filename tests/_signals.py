"""Children a test interrupts with SIGINT start as they would at a terminal."""

AT_A_TERMINAL = ("import signal\n"
                 "signal.signal(signal.SIGINT, signal.default_int_handler)\n")
"""Prepended to a child script that a test sends SIGINT (Ctrl-C): a job a script starts in
the background (``make test &``) inherits SIGINT ignored, and so would the child, which then
never sees the interrupt the test is about."""
