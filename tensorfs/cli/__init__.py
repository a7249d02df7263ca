"""The command line: parsing, messages and exit statuses of every ``tensorfs`` command.  The
top layer: nothing imports it.
"""
