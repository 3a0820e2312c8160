"""Python runs this at the start of every process with this folder on its path: it
installs the fault tests' crash listener (`crash_points`), which `crash_env` asks for.

A misspelt step ends the process here, with the message: Python would print an error
from sitecustomize and run on, and the test would wait for a crash that never comes.
"""

import os
import sys

import crash_points

try:
    crash_points.install()
except ValueError as error:
    sys.stderr.write(f"{error}\n")
    sys.stderr.flush()
    os._exit(1)
