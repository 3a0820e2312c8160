"""Which flavour a session has (`retrylib.spark.flavour`), and that each flavour has every
member the protocol names; no Spark."""

from __future__ import annotations

from types import SimpleNamespace

from retrylib.spark.flavour import Flavour, flavour_of
from retrylib.spark.flavour.classic import Classic
from retrylib.spark.flavour.connect import Connect


class ConnectSession:
    __module__ = "pyspark.sql.connect.session"


def test_a_session_of_pysparks_connect_package_has_the_connect_flavour() -> None:
    assert isinstance(flavour_of(ConnectSession()), Connect)


def test_any_other_session_has_the_classic_flavour() -> None:
    assert isinstance(flavour_of(SimpleNamespace(sparkContext=None)), Classic)


def test_each_flavour_has_every_member_of_the_protocol() -> None:
    members = {name for name in vars(Flavour) if not name.startswith("_")}
    members |= set(Flavour.__annotations__)

    assert members
    assert [name for name in sorted(members) if not hasattr(Classic, name)] == []
    assert [name for name in sorted(members) if not hasattr(Connect, name)] == []


def test_a_classic_flavours_thread_runs_its_target_with_the_args() -> None:
    called: list[tuple[int, str]] = []
    thread = Classic().thread(SimpleNamespace(), lambda *args: called.append(args), (1, "a"))

    thread.start()
    thread.join()

    assert called == [(1, "a")]
