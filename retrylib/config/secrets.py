"""Which config values are secret, never to be shown: one rule for the config's messages and
`Config.redacted()`, the log masking (`retrylib.logs`) and every Kafka client's options.
"""

from __future__ import annotations

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
