"""Where the embedded broker and the tests' servers take their ports from: below the
kernel's ephemeral ports, so no bind(0) or outgoing connection can be handed one of them."""

from retrylib.dev.broker import server_ports


def test_linux_default_range_leaves_ten_thousand_up_to_it():
    assert server_ports(range(32768, 61000)) == range(10_000, 32_768)


def test_a_range_starting_lower_narrows_the_server_ports():
    ports = server_ports(range(20_000, 65_536))
    assert ports == range(10_000, 20_000)
    assert not set(ports) & set(range(20_000, 65_536))


def test_a_range_covering_them_all_leaves_none_and_unknown_leaves_all():
    assert len(server_ports(range(1024, 65_536))) == 0
    assert server_ports(None) == range(10_000, 32_768)
    assert server_ports(range(49_152, 65_536)) == range(10_000, 32_768)  # as macOS has it
