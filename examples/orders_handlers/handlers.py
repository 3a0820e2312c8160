"""Example handlers: `enrich_order` totals an order, and shows each way a handler can fail.

An order is JSON like {"order_id": "o-1", "customer": "c-9", "currency": "EUR",
"items": [{"sku": "a", "qty": 2, "price": 3.5}]}. Two extra fields simulate failures:
"flaky": N fails with `TransientLookupError` until attempt N (retried, then succeeds), and
"poison": true always fails with `RuntimeError` (retried until out of attempts).
"""

from __future__ import annotations

import json
from typing import Any

from retrylib.errors import NonRetryable
from retrylib.record import Record

_TEXT_FIELDS = ("order_id", "customer", "currency")


class TransientLookupError(Exception):
    """Raised when a (simulated) lookup service is briefly unavailable; worth retrying."""


def enrich_order(record: Record) -> dict[str, object]:
    """Return {"order_id", "customer", "total", "currency"}, total = sum of qty * price.

    Raises `NonRetryable` when the value is not a JSON object or lacks a field (retrying
    cannot fix it), `TransientLookupError` while `record.attempt` is below the order's
    "flaky" count, and `RuntimeError` for an order with "poison": true.
    """
    order = _decode(record.value)
    if order.get("poison") is True:
        raise RuntimeError(f"poison order {order.get('order_id')!r} always fails")
    flaky = order.get("flaky", 0)
    if isinstance(flaky, int) and record.attempt < flaky:
        raise TransientLookupError(f"lookup unavailable on attempt {record.attempt}, until {flaky}")
    for name in _TEXT_FIELDS:
        if not isinstance(order.get(name), str):
            raise NonRetryable(f"order field {name!r} must be a string, got {order.get(name)!r}")
    return {
        "order_id": order["order_id"],
        "customer": order["customer"],
        "total": _total(order.get("items")),
        "currency": order["currency"],
    }


def always_fails(record: Record) -> dict[str, object]:
    """Raise `RuntimeError` for every record: a handler that sends everything to the dead letter
    once retries run out.
    """
    raise RuntimeError(f"always fails: {record.topic}[{record.partition}]@{record.offset}")


def _decode(value: bytes | None) -> dict[str, Any]:
    """The JSON object in `value`; raises `NonRetryable` when there is none."""
    if value is None:
        raise NonRetryable("order record has no value")
    try:
        order = json.loads(value)
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        raise NonRetryable(f"order is not JSON: {e}") from e
    if not isinstance(order, dict):
        raise NonRetryable(f"order must be a JSON object, got {order!r}")
    return order


def _total(items: object) -> float:
    """Sum of qty * price over `items`; raises `NonRetryable` when an item lacks either."""
    if not isinstance(items, list):
        raise NonRetryable(f"order field 'items' must be a list, got {items!r}")
    total = 0.0
    for item in items:
        qty, price = (item.get(k) if isinstance(item, dict) else None for k in ("qty", "price"))
        if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in (qty, price)):
            raise NonRetryable(f"order item needs numeric 'qty' and 'price', got {item!r}")
        total += qty * price
    return total
