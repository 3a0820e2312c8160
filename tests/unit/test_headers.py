from __future__ import annotations

import pytest

from retrylib.errors import CorruptRetryHeaders
from retrylib.retry import headers as h
from retrylib.retry.headers import (
    HEADER_DOCS,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_STACK_TRACE_BYTES,
    PREFIX,
    RetryState,
    bound_text,
    decode_retry_state,
    encode_dead_letter_headers,
    encode_retry_headers,
    record_id,
    split_headers,
)

STATE = RetryState(
    job="orders-job",
    id="0123456789abcdef0123456789abcdef",
    attempt=2,
    not_before_ms=1_700_000_060_000,
    origin_topic="orders",
    origin_partition=3,
    origin_offset=41,
    origin_timestamp_ms=1_699_999_999_000,
    first_failure_ms=1_700_000_000_000,
    last_failure_ms=1_700_000_030_000,
    error_class="builtins.ValueError",
    error_message="bad order: ünïcødé ✓",
)

USER = [("trace", b"abc"), ("empty", None), ("trace", b"def"), ("bin", b"\xff\x00")]

RETRY_HEADER_NAMES = [
    "retrylib.job",
    "retrylib.id",
    "retrylib.attempt",
    "retrylib.not_before",
    "retrylib.origin.topic",
    "retrylib.origin.partition",
    "retrylib.origin.offset",
    "retrylib.origin.timestamp",
    "retrylib.first_failure",
    "retrylib.last_failure",
    "retrylib.error.class",
    "retrylib.error.message",
]
DEAD_LETTER_HEADER_NAMES = [
    "retrylib.attempts",
    "retrylib.dead_letter.reason",
    "retrylib.error.stack_trace",
]
TRUNCATION_HEADER_NAMES = [
    "retrylib.value_truncated",
    "retrylib.headers_dropped",
    "retrylib.key_truncated",
]


def _ours(encoded: list[tuple[str, bytes | None]]) -> dict[str, bytes | None]:
    return split_headers(encoded)[1]


# --- record_id -----------------------------------------------------------------------------


def test_record_id_is_deterministic_32_hex() -> None:
    first = record_id("job", "orders", 0, 5)
    assert first == record_id("job", "orders", 0, 5)
    assert len(first) == 32
    assert set(first) <= set("0123456789abcdef")


def test_record_id_keeps_its_value_across_versions() -> None:
    # Ids are kept in dead-letter tables and retry headers: a new version must give the
    # same id for the same record (the first 32 hex digits of the SHA-256 of the JSON list).
    assert record_id("job", "orders", 0, 5) == "cd4f6bc38877ed6da8fdc3a4b52460c0"
    # Names JSON escapes (quotes, backslashes, control and separator characters), non-ASCII.
    odd = record_id('jöb "q"\\', "tö\npic\u2028", 3, 12345678901)
    assert odd == "08f08b2a2ef03fb7f2bc8a7ebdfcfadf"


@pytest.mark.parametrize(
    "other",
    [
        ("job2", "orders", 0, 5),
        ("job", "orders2", 0, 5),
        ("job", "orders", 1, 5),
        ("job", "orders", 0, 6),
        # Would collide under naive "job:topic:partition:offset" joining.
        ("job:orders", "0", 0, 5),
    ],
)
def test_record_id_differs_when_any_part_differs(other: tuple[str, str, int, int]) -> None:
    assert record_id(*other) != record_id("job", "orders", 0, 5)


def test_record_ids_are_distinct_over_many_offsets() -> None:
    ids = {record_id("job", "t", p, o) for p in range(4) for o in range(2500)}
    assert len(ids) == 10_000


# --- split_headers -------------------------------------------------------------------------


def test_split_headers_keeps_user_headers_in_order_with_none_and_duplicates() -> None:
    mixed = [USER[0], ("retrylib.attempt", b"1"), *USER[1:], ("retrylib.id", b"x")]
    user, ours = split_headers(mixed)
    assert user == USER
    assert ours == {"retrylib.attempt": b"1", "retrylib.id": b"x"}


@pytest.mark.parametrize("empty", [None, []])
def test_split_headers_of_nothing(empty: list[tuple[str, bytes | None]] | None) -> None:
    assert split_headers(empty) == ([], {})


def test_split_headers_converts_bytearray_values_to_bytes() -> None:
    user, ours = split_headers([("a", bytearray(b"1")), ("retrylib.id", bytearray(b"x"))])
    assert user == [("a", b"1")] and type(user[0][1]) is bytes
    assert ours == {"retrylib.id": b"x"} and type(ours["retrylib.id"]) is bytes


def test_split_headers_leaves_a_users_own_retrylib_named_header_to_the_user() -> None:
    user, ours = split_headers([("retrylib.x", b"1"), ("retrylib.id", b"x"), ("retrylib", b"2")])
    assert user == [("retrylib.x", b"1"), ("retrylib", b"2")]
    assert ours == {"retrylib.id": b"x"}


def test_without_reserved_takes_off_exactly_the_reserved_names() -> None:
    mixed = [("retrylib.id", b"forged"), *USER, ("retrylib.x", b"mine"), ("retrylib.job", None)]
    assert h.without_reserved(mixed) == ([*USER, ("retrylib.x", b"mine")], 2)
    assert h.without_reserved(USER) == (USER, 0)


def test_split_headers_last_duplicate_retrylib_header_wins() -> None:
    _, ours = split_headers([("retrylib.attempt", b"1"), ("retrylib.attempt", b"2")])
    assert ours == {"retrylib.attempt": b"2"}


# --- encode / decode -----------------------------------------------------------------------


def test_round_trip_encode_split_decode() -> None:
    user, ours = split_headers(encode_retry_headers(USER, STATE))
    assert user == USER
    assert decode_retry_state(ours) == STATE


def test_encode_puts_user_headers_first_then_every_retry_header() -> None:
    encoded = encode_retry_headers(USER, STATE)
    assert encoded[: len(USER)] == USER
    assert [name for name, _ in encoded[len(USER) :]] == RETRY_HEADER_NAMES


def test_encoded_values_are_utf8_text_with_decimal_ints() -> None:
    ours = _ours(encode_retry_headers([], STATE))
    assert ours["retrylib.attempt"] == b"2"
    assert ours["retrylib.not_before"] == b"1700000060000"
    assert ours["retrylib.origin.partition"] == b"3"
    assert ours["retrylib.error.message"] == STATE.error_message.encode("utf-8")


def test_encode_replaces_old_retrylib_headers_without_duplicates() -> None:
    first = encode_retry_headers(USER, STATE)
    later = STATE._replace(attempt=3, last_failure_ms=STATE.last_failure_ms + 1)
    second = encode_retry_headers(first, later)
    names = [name for name, _ in second]
    assert len(names) == len(USER) + len(RETRY_HEADER_NAMES)
    assert decode_retry_state(_ours(second)) == later
    assert split_headers(second)[0] == USER


def test_encode_bounds_a_long_error_message() -> None:
    state = STATE._replace(error_message="é" * 5000)
    decoded = decode_retry_state(_ours(encode_retry_headers([], state)))
    assert len(decoded.error_message.encode("utf-8")) <= MAX_ERROR_MESSAGE_BYTES
    assert decoded.error_message.endswith("bytes]")


def test_dead_letter_headers_add_attempts_reason_and_bounded_trace() -> None:
    encoded = encode_dead_letter_headers(
        USER, STATE, attempts=4, reason="attempts_exhausted", stack_trace="x" * 20_000
    )
    user, ours = split_headers(encoded)
    assert user == USER
    assert [name for name, _ in encoded[len(USER) :]] == (
        RETRY_HEADER_NAMES + DEAD_LETTER_HEADER_NAMES
    )
    assert ours["retrylib.attempts"] == b"4"
    assert ours["retrylib.dead_letter.reason"] == b"attempts_exhausted"
    trace = ours["retrylib.error.stack_trace"]
    assert trace is not None and len(trace) <= MAX_STACK_TRACE_BYTES
    assert decode_retry_state(ours) == STATE


def test_dead_letter_headers_of_a_retried_record_do_not_duplicate() -> None:
    retried = encode_retry_headers(USER, STATE)
    encoded = encode_dead_letter_headers(
        retried, STATE, attempts=3, reason="non_retryable", stack_trace="tb"
    )
    names = [name for name, _ in encoded]
    assert len(names) == len(USER) + len(RETRY_HEADER_NAMES) + len(DEAD_LETTER_HEADER_NAMES)


# --- corrupt headers -----------------------------------------------------------------------


def _valid() -> dict[str, bytes | None]:
    return _ours(encode_retry_headers([], STATE))


@pytest.mark.parametrize("name", RETRY_HEADER_NAMES)
def test_missing_header_is_corrupt_and_named(name: str) -> None:
    headers = _valid()
    del headers[name]
    with pytest.raises(CorruptRetryHeaders, match=f"'{name}' is missing"):
        decode_retry_state(headers)


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("retrylib.id", None, "has no value"),
        ("retrylib.id", b"", "is empty"),
        ("retrylib.origin.topic", b"", "is empty"),
        ("retrylib.attempt", b"two", "not a decimal integer"),
        ("retrylib.attempt", b"", "not a decimal integer"),
        ("retrylib.attempt", b" 2", "not a decimal integer"),
        ("retrylib.attempt", b"1_0", "not a decimal integer"),
        ("retrylib.attempt", b"2.0", "not a decimal integer"),
        ("retrylib.attempt", "٣".encode(), "not a decimal integer"),
        ("retrylib.attempt", b"-1", "must be >= 0"),
        ("retrylib.origin.partition", b"-1", "must be >= 0"),
        ("retrylib.origin.offset", b"-5", "must be >= 0"),
        ("retrylib.not_before", b"\xff\xfe", "not valid UTF-8"),
        ("retrylib.error.message", b"caf\xc3", "not valid UTF-8"),
    ],
)
def test_bad_header_value_is_corrupt_and_named(name: str, value: bytes | None, why: str) -> None:
    headers = _valid()
    headers[name] = value
    with pytest.raises(CorruptRetryHeaders, match=f"'{name}' .*{why}"):
        decode_retry_state(headers)


def test_corrupt_retry_headers_is_a_value_error() -> None:
    assert issubclass(CorruptRetryHeaders, ValueError)


def test_negative_timestamps_decode() -> None:
    # Kafka reports -1 for a record without a timestamp; that is not corruption.
    headers = _valid()
    headers["retrylib.origin.timestamp"] = b"-1"
    assert decode_retry_state(headers).origin_timestamp_ms == -1


def test_decode_ignores_unknown_and_dead_letter_headers() -> None:
    headers = _valid()
    headers["retrylib.future_field"] = b"?"
    headers["retrylib.attempts"] = b"4"
    assert decode_retry_state(headers) == STATE


# --- bound_text ----------------------------------------------------------------------------


def test_bound_text_leaves_short_text_alone() -> None:
    assert bound_text("héllo", 6) == "héllo"


@pytest.mark.parametrize("char", ["a", "é", "✓", "😀"])
@pytest.mark.parametrize("limit", [30, 31, 32, 33, 100])
def test_bound_text_never_exceeds_limit_or_splits_a_character(char: str, limit: int) -> None:
    text = char * 200
    bounded = bound_text(text, limit)
    size = len(bounded.encode("utf-8"))
    assert size <= limit
    kept, marker = bounded.split("…[truncated ")
    assert kept == char * len(kept)
    dropped = int(marker.removesuffix(" bytes]"))
    assert dropped == len(text.encode("utf-8")) - len(kept.encode("utf-8"))
    # Not wasteful: no room for another whole character was left over.
    assert limit - size < len(char.encode("utf-8")) + 1


def test_bound_text_exact_fit_is_not_truncated() -> None:
    text = "😀" * 10
    assert bound_text(text, 40) == text


def test_bound_text_replaces_lone_surrogates() -> None:
    assert bound_text("a\udcffb", 100) == "a?b"


def test_bound_text_limit_below_marker_raises() -> None:
    with pytest.raises(ValueError, match="limit_bytes"):
        bound_text("x" * 100, 5)


# --- documentation -------------------------------------------------------------------------


def test_header_docs_cover_every_header_once() -> None:
    names = [name for name, _ in HEADER_DOCS]
    assert names == [
        *RETRY_HEADER_NAMES,
        *DEAD_LETTER_HEADER_NAMES,
        *TRUNCATION_HEADER_NAMES,
        "retrylib.signature",
    ]
    assert all(name.startswith(PREFIX) and meaning for name, meaning in HEADER_DOCS)
    assert frozenset(names) == h.RESERVED


def test_header_constants_match_docs() -> None:
    assert h.ID == "retrylib.id"
    assert h.ERROR_STACK_TRACE == "retrylib.error.stack_trace"


# --- signatures ----------------------------------------------------------------------------

SIGNED = {"signing_key": b"k" * 32, "topic": "orders.job.retry.10s", "key": b"k1", "value": b"v"}


def _signed() -> list[tuple[str, bytes | None]]:
    return h.sign(encode_retry_headers(USER, STATE), **SIGNED)


def test_signatures_stay_what_earlier_versions_wrote() -> None:
    """Records signed by an earlier version of the job still wait in the retry topics."""
    headers = [("retrylib.attempt", b"2"), ("trace", None), ("x", b"")]
    signed = h.sign(
        headers, signing_key=b"k" * 32, topic="orders.retry.2s", key=b"key-1", value=b'{"v": 1}'
    )
    bare = h.sign([], signing_key=b"k" * 32, topic="t", key=None, value=None)

    assert signed[-1][1] == b"b81b0e85e503923f1574f625b9b0abb768b0dfe19a4308a664a0ee2d5c6b22f3"
    assert bare[-1][1] == b"3674e5ff5a62a1bcd08871b6732a950741c102b678f226f776718645536b1fdf"
    accented = h.sign(
        [("trâce", "é".encode()), ("retrylib.attempt", b"1")],
        signing_key=b"k" * 32,
        topic="commandes.réessai",
        key=b"\xff",
        value=None,
    )
    assert accented[-1][1] == b"1464adbaebb24b57f62d8cb4dd34463b30c4407e9784a8bcc929c5cfed8e80fe"


def test_a_signed_record_verifies_and_keeps_its_headers_ahead_of_the_signature() -> None:
    signed = _signed()
    assert signed[:-1] == encode_retry_headers(USER, STATE)
    assert signed[-1][0] == "retrylib.signature" and len(signed[-1][1] or b"") == 64
    assert h.is_signed_by(signed, **SIGNED)


@pytest.mark.parametrize(
    "change",
    [
        {"signing_key": b"j" * 32},
        {"topic": "orders.other.retry.10s"},
        {"key": None},
        {"key": b"k2"},
        {"value": b""},
        {"value": None},
        {"value": b"v2"},
    ],
)
def test_a_signature_fails_for_another_key_topic_or_content(change: dict) -> None:
    assert not h.is_signed_by(_signed(), **{**SIGNED, **change})


@pytest.mark.parametrize(
    "tamper",
    [
        lambda hs: [(n, b"3" if n == "retrylib.attempt" else v) for n, v in hs],
        lambda hs: [("trace", b"abd") if (n, v) == ("trace", b"abc") else (n, v) for n, v in hs],
        lambda hs: [("x", b"")] + hs,
        lambda hs: hs[1:],
        lambda hs: hs[:-1],
        lambda hs: hs[-1:] + hs[:-1],
        lambda hs: hs[:-1] + [("retrylib.signature", None)],
        lambda hs: [],
    ],
    ids=["field", "user-header", "added", "removed", "unsigned", "moved", "empty", "none"],
)
def test_a_signature_fails_when_any_header_changes(tamper) -> None:
    assert not h.is_signed_by(tamper(_signed()), **SIGNED)


def test_header_boundaries_are_part_of_what_is_signed() -> None:
    # Same bytes, split differently between name and value, must not share a signature.
    one = h.sign([("ab", b"c")], **SIGNED)
    assert not h.is_signed_by([("a", b"bc"), one[-1]], **SIGNED)
