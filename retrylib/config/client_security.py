"""One `[kafka.security]` setting, spelled for each kind of Kafka client the job runs.

Spark's Kafka connector is Apache Kafka's Java client; retrylib's own clients (tier source,
producers, admin, `status`, `redrive`) are librdkafka's. The two spell SASL and TLS
differently: the Java client takes a JAAS line and a truststore, librdkafka takes
`sasl.username`/`sasl.password` and a CA file. `librdkafka_security` and `java_security`
write the same setting both ways, so a user states it once.

An OAUTHBEARER token provider is a Python function, so it reaches librdkafka's clients only
(as confluent-kafka's `oauth_cb`, resolved in each process by
`retrylib.kafka.clients.token_callback`); the Java client logs in with a JAAS line and callback
handler of its own, from `[kafka.java_options]`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KafkaSecurity:
    """[kafka.security]: how every Kafka client of the job connects and logs in.

    `mechanism` is set exactly when `protocol` is SASL_*; `username` and `password` go with
    PLAIN and SCRAM; `token_provider` ("module:function", called as confluent-kafka calls
    `oauth_cb`) with OAUTHBEARER; `ca_file` (PEM) with SSL and SASL_SSL.
    """

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    token_provider: str | None = None

    def describe(self, *, user_shown: bool = True) -> str:
        """How the job logs in, for error messages: never the password, and the user name
        only when `user_shown`."""
        if self.mechanism is None:
            return f"security.protocol {self.protocol}"
        user = f", user {self.username!r}" if self.username and user_shown else ""
        return f"SASL {self.mechanism} over {self.protocol}{user}"


TOKEN_PROVIDER_OPTION = "retrylib.oauth_token_provider"
"""The librdkafka option that carries the token provider's reference ("module:function") to
every process; `retrylib.kafka.clients.token_callback` turns it into confluent-kafka's
`oauth_cb` there."""
TOKEN_PROVIDER_PATHS_OPTION = "retrylib.oauth_token_provider_paths"
"""JSON list of the folders to import the token provider from (`handler.paths`)."""

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Databricks Runtime shades the Kafka client it ships: its classes live under this package.
_DATABRICKS_SHADED_PREFIX = "kafkashaded."


def librdkafka_security(
    security: KafkaSecurity | None, import_paths: tuple[str, ...] = ()
) -> dict[str, str]:
    """`security` as librdkafka's properties (and the token provider's pseudo options,
    with the folders it imports from)."""
    if security is None:
        return {}
    options = {"security.protocol": security.protocol}
    if security.mechanism is not None:
        options["sasl.mechanism"] = security.mechanism
    if security.username is not None:
        options["sasl.username"] = security.username
    if security.password is not None:
        options["sasl.password"] = security.password
    if security.ca_file is not None:
        options["ssl.ca.location"] = security.ca_file
    if security.token_provider is not None:
        options[TOKEN_PROVIDER_OPTION] = security.token_provider
        options[TOKEN_PROVIDER_PATHS_OPTION] = json.dumps(list(import_paths))
    return options


def java_security(
    security: KafkaSecurity | None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """`security` as the Java client's properties (without the "kafka." prefix Spark adds).

    On Databricks (`DATABRICKS_RUNTIME_VERSION` set) the login module's class name carries
    the runtime's shaded package, as its Kafka client requires. OAUTHBEARER gets no JAAS
    line: the Java client's login comes from `[kafka.java_options]`.
    """
    if security is None:
        return {}
    options = {"security.protocol": security.protocol}
    if security.mechanism is not None:
        options["sasl.mechanism"] = security.mechanism
    module = _LOGIN_MODULES.get(security.mechanism or "")
    if module is not None and security.username is not None and security.password is not None:
        if environ.get("DATABRICKS_RUNTIME_VERSION"):
            module = _DATABRICKS_SHADED_PREFIX + module
        options["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quoted(security.username)} "
            f"password={_jaas_quoted(security.password)};"
        )
    if security.ca_file is not None:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = security.ca_file
    return options


def _jaas_quoted(value: str) -> str:
    """`value` as a JAAS option value: in double quotes, with `\\` and `"` escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
