"""The command-line tools, packaged so that `pip install` brings them as commands.

Each module is one tool with a `console_main` (setup.py's `t2t-<name>` commands); the
repository's `tools/<name>.py` files are thin launchers of the same function, so
`python tools/X.py` from a checkout and `t2t-X` after an install run the same code.
Like the entry points, they parse flags and call library functions.
"""

