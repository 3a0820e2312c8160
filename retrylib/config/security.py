"""Reading [kafka.security] and checking it against the rest of [kafka].

One login for every Kafka client of the job; `retrylib.config.client_security` writes it in each
client's own terms. The checks here refuse a setting that one kind of client would
silently ignore or spell twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from retrylib.config.client_security import KafkaSecurity, java_security, librdkafka_security
from retrylib.config.values import FUNCTION_REF, SASL_MECHANISM, SECURITY_PROTOCOL, TEXT, Table

_LOGINS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def read_security(t: Table) -> KafkaSecurity | None:
    """The [kafka.security] table as `KafkaSecurity`; None when absent or wrong."""
    if not t.data:
        t.finish()
        return None
    protocol = t.get("protocol", SECURITY_PROTOCOL, 'protocol = "SASL_SSL"')
    sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    mechanism = t.get("mechanism", SASL_MECHANISM, 'mechanism = "SCRAM-SHA-512"', None)
    username = t.get("username", TEXT, 'username = "orders-job"', None)
    password = t.get("password", TEXT, 'password = "${env:KAFKA_PASSWORD}"', None)
    ca_file = t.get("ca_file", TEXT, 'ca_file = "/etc/kafka/ca.pem"', None)
    provider = t.get("token_provider", FUNCTION_REF, 'token_provider = "tokens:fetch"', None)
    t.finish()
    if protocol is None:
        return None
    if sasl and "mechanism" not in t.data:
        t.problems.add(
            t.path("mechanism"),
            f'missing; {protocol} logs in with a SASL mechanism: add mechanism = "SCRAM-SHA-512" '
            "(or PLAIN, SCRAM-SHA-256, OAUTHBEARER)",
        )
    if not sasl:
        for key in ("mechanism", "username", "password", "token_provider"):
            if t.data.get(key) is not None:
                t.problems.add(
                    t.path(key),
                    'only used with SASL; set protocol = "SASL_SSL" (or SASL_PLAINTEXT), '
                    "or remove it",
                )
    if mechanism in _LOGINS:
        for key in ("username", "password"):
            if key not in t.data:
                t.problems.add(t.path(key), f"missing; SASL {mechanism} logs in with it")
        if "token_provider" in t.data:
            t.problems.add(
                t.path("token_provider"),
                f"only used with OAUTHBEARER, not {mechanism}; remove it",
            )
    if mechanism == "OAUTHBEARER":
        for key in ("username", "password"):
            if key in t.data:
                t.problems.add(
                    t.path(key),
                    "not used with OAUTHBEARER (the token provider logs in); remove it",
                )
    if ca_file is not None:
        if protocol not in ("SSL", "SASL_SSL"):
            t.problems.add(
                t.path("ca_file"),
                'only used with TLS; set protocol = "SSL" or "SASL_SSL", or remove it',
            )
        elif not os.path.isfile(ca_file):
            t.problems.add(
                t.path("ca_file"),
                f"no such file {t.problems.show(t.path('ca_file'), ca_file)}; give the PEM file "
                "of the certificates that signed the brokers' (the same path on every node)",
            )
    if not t.ok:
        return None
    return KafkaSecurity(protocol, mechanism, username, password, ca_file, provider)


def check_security(
    t: Table,
    security: KafkaSecurity,
    options: Mapping[str, str],
    java_options: Mapping[str, str],
    librdkafka_options: Mapping[str, str],
    source: str | None,
) -> None:
    """Problems where [kafka.security] meets the option tables of [kafka] (`t`)."""
    derived = {**librdkafka_security(security), **java_security(security)}
    for name in sorted(set(options) & set(derived)):
        t.problems.add(
            f"{t.path('options')}.{json.dumps(name)}",
            "also set by [kafka.security]; keep one (a value for one kind of client only "
            "goes in kafka.java_options or kafka.librdkafka_options)",
        )
    if security.mechanism != "OAUTHBEARER":
        return
    oidc = {**options, **librdkafka_options}.get("sasl.oauthbearer.method", "").lower() == "oidc"
    if security.token_provider is None and not oidc:
        t.problems.add(
            t.path("security.token_provider"),
            "missing; OAUTHBEARER needs a function that returns a token, e.g. token_provider = "
            '"tokens:fetch" (or librdkafka\'s own OIDC: "sasl.oauthbearer.method" = "oidc" in '
            "kafka.librdkafka_options)",
        )
    if source != "python" and "sasl.jaas.config" not in {**options, **java_options}:
        t.problems.add(
            t.path("java_options"),
            "Spark's Kafka connector (Java) needs its own OAUTHBEARER login: add "
            '"sasl.jaas.config" (and "sasl.login.callback.handler.class") here, or set '
            'kafka.source = "python" so that every client is retrylib\'s',
        )
