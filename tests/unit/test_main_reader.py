"""Which reader takes the main topics: "auto" on a new checkpoint, and a checkpoint's record."""

from __future__ import annotations

import pytest

from retrylib.errors import RetrylibError
from retrylib.source.main_reader import main_reader

RECORD = "cp/retrylib/main_reader.json"


def connector_there() -> bool:
    return True


def no_connector() -> bool:
    return False


def choose(configured: str, recorded: str | None, resumed: bool, connector=connector_there):
    return main_reader(configured, recorded, resumed, connector, RECORD)


def test_auto_gives_a_new_checkpoint_retrylibs_own_reader_even_with_the_connector_there():
    assert choose("auto", None, resumed=False) == "python"


@pytest.mark.parametrize("recorded", ["builtin", "python"])
def test_auto_keeps_the_reader_a_checkpoint_was_started_with(recorded):
    assert choose("auto", recorded, resumed=True) == recorded


@pytest.mark.parametrize(
    ("connector", "picked"), [(connector_there, "builtin"), (no_connector, "python")]
)
def test_a_checkpoint_from_before_the_record_keeps_what_auto_picked_then(connector, picked):
    assert choose("auto", None, resumed=True, connector=connector) == picked


@pytest.mark.parametrize("configured", ["builtin", "python"])
def test_a_named_reader_is_used_on_a_new_checkpoint(configured):
    assert choose(configured, None, resumed=False) == configured
    assert choose(configured, None, resumed=True) == configured


def test_the_reader_may_change_while_no_batch_was_planned():
    assert choose("builtin", "python", resumed=False) == "builtin"


def test_naming_the_other_reader_than_a_resumed_checkpoints_is_refused_with_the_way_out():
    with pytest.raises(RetrylibError) as refused:
        choose("builtin", "python", resumed=True)
    assert str(refused.value) == (
        'kafka.source = "builtin", but this checkpoint was started reading the main topics '
        f'with "python" ({RECORD}), and Spark cannot resume a query whose sources changed: '
        'set kafka.source = "python" (or "auto"), or start the job from a new checkpoint '
        "(job.checkpoint)"
    )
