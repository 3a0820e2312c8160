"""An OAUTHBEARER token provider for the tests' broker, which takes unsigned tokens.

Each call appends "<pid>" to the file named in librdkafka's `sasl.oauthbearer.config`
("calls=<path>"), so a test can see which processes logged in with it.
"""

from __future__ import annotations

import base64
import json
import os
import time

SUBJECT = "orders-job"


def _part(claims: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")


def unsecured_token(config: str) -> tuple[str, float]:
    """A token for `SUBJECT` valid for an hour, and when it expires (epoch seconds)."""
    settings = dict(item.split("=", 1) for item in config.split())
    if "calls" in settings:
        with open(settings["calls"], "a") as calls:
            calls.write(f"{os.getpid()}\n")
    now = time.time()
    claims = {"sub": SUBJECT, "iat": int(now), "exp": int(now) + 3600}
    return f"{_part({'alg': 'none'})}.{_part(claims)}.", now + 3600
