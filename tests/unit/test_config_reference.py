"""docs/config.md has a row for every key the config loader accepts and for no other key;
conf/orders.toml shows every key of a handler job and conf/retry_router.toml every key of
[delay_router], set or commented out."""

from __future__ import annotations

import re
from pathlib import Path

from retrylib.config.loader import accepted_keys

ROOT = Path(__file__).parents[2]
_ROW = re.compile(r"^\| `([a-z_.]+)` \|", re.M)
_HEADER = re.compile(r"^#?\s*\[([a-z_.]+)\]")
_KEY = re.compile(r"^#?\s*([a-z_]+)\s*=")


def keys_shown(path: Path, accepted: frozenset[str]) -> set[str]:
    """The dotted keys an example config sets or shows commented out (`# key = ...`); a table
    of free-form entries (`[kafka.options]`) shows its own key, not its entries'."""
    keys, table = set(), ""
    for line in path.read_text().splitlines():
        if header := _HEADER.match(line):
            table = header[1]
            if table in accepted:
                keys.add(table)
        elif (key := _KEY.match(line)) and table not in accepted:
            keys.add(f"{table}.{key[1]}")
    return keys


def test_the_config_reference_has_one_row_for_each_key_the_loader_accepts() -> None:
    rows = _ROW.findall((ROOT / "docs" / "config.md").read_text())
    assert sorted(rows) == sorted(accepted_keys() | accepted_keys(delay_router=True))


def test_orders_toml_shows_every_key_of_a_handler_job() -> None:
    accepted = accepted_keys()
    assert keys_shown(ROOT / "conf" / "orders.toml", accepted) == accepted


def test_retry_router_toml_shows_every_delay_router_key_and_no_other() -> None:
    accepted = accepted_keys(delay_router=True)
    shown = keys_shown(ROOT / "conf" / "retry_router.toml", accepted)
    assert shown <= accepted
    assert {key for key in accepted if key.startswith("delay_router.")} <= shown


def test_accepted_keys_name_each_key_of_a_sub_table_and_a_free_form_table_as_one() -> None:
    keys = accepted_keys()
    assert {"kafka.security.protocol", "kafka.options", "dead_letter.routes"} <= keys
    assert "kafka.security" not in keys and "kafka" not in keys
    assert "delay_router.topics" in accepted_keys(delay_router=True)
    assert not any(key.startswith("delay_router.") for key in keys)
