"""Databricks entry point: `run_job.py [--env=NAME=VALUE]... [--secret-env=NAME=SCOPE/KEY]...
CONF [--available-now]` runs `retrylib run CONF [--available-now]`, and
`run_job.py [--env=...]... status|redrive CONF [OPTIONS]` that `retrylib` command (the
bundle's status and redrive jobs).

The config's ${env:NAME} values are read from this process's environment. A job cluster
sets them in its spark_env_vars; serverless compute has no such setting, so the serverless
task passes them as its first parameters instead: `--env=NAME=VALUE` sets NAME to VALUE, and
`--secret-env=NAME=SCOPE/KEY` sets NAME to the Databricks secret KEY in SCOPE (read with
dbutils.secrets.get), so that no secret is written among the job's parameters.

The bundle's variables that have no value of the user's hold YOUR-... placeholders (so that
`databricks bundle validate` passes as written); a run given one stops before Spark starts,
naming the variable to set.

`sys.exit` carries the exit code to the task (0 done or stopped, 1 failed, 2 bad usage,
a placeholder, or bad config).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence

from retrylib.config.placeholders import placeholder_in
from retrylib.ops.cli import script_main

ENV = "--env"
SECRET_ENV = "--secret-env"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # as ${env:NAME} in the config
# databricks.yml's defaults of the variables the user must give are placeholders
# (retrylib.config.placeholders): RETRYLIB_<NAME> carries the bundle variable <name>.
_BUNDLE_PREFIX = "RETRYLIB_"


class UsageError(ValueError):
    """A malformed --env/--secret-env argument (the message never holds its value)."""


def read_secret(scope: str, key: str) -> str:
    """The Databricks secret `key` in `scope` (only on Databricks, where dbutils exists)."""
    from databricks.sdk.runtime import dbutils

    return dbutils.secrets.get(scope=scope, key=key)


def set_environment(
    args: Sequence[str],
    environ: MutableMapping[str, str],
    secret: Callable[[str, str], str] = read_secret,
) -> list[str]:
    """Apply the leading --env=/--secret-env= arguments to `environ`; return the others."""
    rest = list(args)
    while rest and rest[0].startswith((f"{ENV}=", f"{SECRET_ENV}=")):
        option, _, assignment = rest.pop(0).partition("=")
        name, equals, value = assignment.partition("=")
        if not _NAME.fullmatch(name) or not equals:
            raise UsageError(f"{option} takes NAME=VALUE with NAME a variable name")
        if option == SECRET_ENV:
            scope, slash, key = value.partition("/")
            if not scope or not slash or not key:
                raise UsageError(f"{SECRET_ENV}={name}=... takes SCOPE/KEY of a secret")
            value = secret(scope, key)
        environ[name] = value
    return rest


def placeholder_errors(environ: Mapping[str, str]) -> list[str]:
    """A line for each bundle variable whose placeholder reached `environ` unset."""
    return [
        f"{name} is the bundle's placeholder {value!r}: deploy with --var "
        f"{name.removeprefix(_BUNDLE_PREFIX).lower()}=<yours> (deploy/README.md)"
        for name, value in sorted(environ.items())
        if name.startswith(_BUNDLE_PREFIX) and placeholder_in(value)
    ]


if __name__ == "__main__":
    try:
        arguments = set_environment(sys.argv[1:], os.environ)
    except UsageError as error:
        print(f"run_job.py: {error}", file=sys.stderr)
        sys.exit(2)
    placeholders = placeholder_errors(os.environ)
    for line in placeholders:
        print(f"run_job.py: {line}", file=sys.stderr)
    if placeholders:
        sys.exit(2)
    sys.exit(script_main(arguments))
