"""Which config values are secret, never to be shown, and what shows instead (`MASK`): one
rule for the config's messages and `Config.redacted()`, the log masking (`retrylib.logs`) and
every Kafka client's options (`retrylib.kafka.clients`).
"""

from __future__ import annotations

from collections.abc import Collection

MASK = "***"
"""What a hidden value shows as, in config output, messages and log lines."""
OPTION_TABLES = ("kafka.options", "kafka.java_options", "kafka.librdkafka_options")
"""The dotted keys of the Kafka client option tables: below each, the rest of a key is one
option name ("sasl.mechanism")."""
_SECRET_KEYS = frozenset({"kafka.security.password"})
_SECRET_MARKERS = (
    "password",
    "passwd",
    "secret",
    "token",
    "key",
    "credential",
    "jaas",
    "user.info",
    "oauthbearer.config",
)


def is_secret_key(name: str) -> bool:
    """True when a Kafka option called `name` may hold a secret ("sasl.password",
    "sasl.jaas.config", "basic.auth.user.info", ...). It errs towards hiding: "key.serializer"
    counts as secret too.
    """
    lowered = name.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


def is_hidden(key: str, from_env: Collection[str]) -> bool:
    """True for the value at dotted config `key` when it is never to be shown: set from
    ${env:...} (`from_env` holds those keys), the login's password, or a Kafka option that
    looks secret (`is_secret_key`)."""
    if key in from_env or key in _SECRET_KEYS:
        return True
    return any(
        key.startswith(f"{table}.") and is_secret_key(key[len(table) + 1 :])
        for table in OPTION_TABLES
    )
