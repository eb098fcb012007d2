"""``--address-map``: parsing and rewriting what any provider reports."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError
from cloud_elastic.providers.addressmap import AddressMappedDiscovery, map_address, parse_address_map
from cloud_elastic.providers.api import DiscoveredHosts, Drain, HostDiscovery
from tests.contract.scripted import ScriptedDiscovery


def test_addresses_keep_their_offset_and_the_first_matching_rule_wins():
    rules = parse_address_map(["10.20.1.0/24=127.0.1.0/24", "10.20.0.0/16=127.1.0.0/16", "10.9.9.9=127.0.0.9"])
    assert map_address("10.20.1.7", rules) == "127.0.1.7"
    assert map_address("10.20.3.4", rules) == "127.1.3.4"
    assert map_address("10.9.9.9", rules) == "127.0.0.9"
    assert map_address("192.168.0.1", rules) == "192.168.0.1"  # no rule: unchanged
    assert map_address("gpu-node-1", rules) == "gpu-node-1"  # names pass through


@pytest.mark.parametrize(("spec", "message"), [
    ("10.0.0.0/24", "expects FROM=TO"),
    ("10.0.0.0/24=127.0.0.0/16", "same IP version and prefix length"),
    ("10.0.0.0/24=::/120", "same IP version and prefix length"),
    ("fd00::/120=fd01::/120", "IPv6 is not supported"),
    ("10.0.0.1/24=127.0.0.0/24", "has host bits set"),
    ("ten=127.0.0.0/24", "does not appear to be"),
])
def test_bad_rules_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_address_map([spec])


def test_wrapper_maps_ready_and_draining_and_passes_errors_and_close_through():
    inner = ScriptedDiscovery([
        DiscoveredHosts(ready={"10.0.0.1": 4}, draining={"10.0.0.2": Drain(5.0, "Terminating:Wait")}),
        FatalDiscoveryError("group gone"),
    ])
    wrapped = AddressMappedDiscovery(inner, parse_address_map(["10.0.0.0/24=127.0.3.0/24"]))
    assert wrapped.find() == DiscoveredHosts(ready={"127.0.3.1": 4}, draining={"127.0.3.2": Drain(5.0, "Terminating:Wait")})
    assert wrapped.name == "scripted"
    with pytest.raises(FatalDiscoveryError, match="group gone"):
        wrapped.find()
    wrapped.close()
    assert inner.closed == 1


def test_two_hosts_mapped_onto_one_address_is_fatal():
    inner = ScriptedDiscovery([DiscoveredHosts(ready={"10.0.0.1": 1, "127.0.3.1": 1})])
    wrapped = AddressMappedDiscovery(inner, parse_address_map(["10.0.0.0/24=127.0.3.0/24"]))
    with pytest.raises(FatalDiscoveryError, match="sends both"):
        wrapped.find()


#: HostDiscovery methods the wrapper does not pass on: it builds itself (from_options), checks nothing
#: (check_options), and maps what find() returns instead.
_NOT_PASSED_ON = {"from_options", "check_options", "find"}


def test_the_wrapper_passes_on_every_optional_method_of_the_interface():
    """A method added to HostDiscovery and not passed on falls back to the default, silently (a wrapped group's
    MaxSize once went unseen by --manage-capacity): every one the wrapper lacks fails here."""
    optional = {name for name, value in vars(HostDiscovery).items()
                if callable(getattr(HostDiscovery, name)) and not name.startswith("_")} - _NOT_PASSED_ON
    assert optional >= {"release", "set_capacity", "capacity_limits", "hourly_prices", "wake_on_news", "close"}
    missing = sorted(name for name in optional if name not in vars(AddressMappedDiscovery))
    assert missing == [], f"AddressMappedDiscovery does not pass on {missing}"


def test_the_wrapped_groups_capacity_limits_reach_manage_capacity():
    class Limited(ScriptedDiscovery):
        def capacity_limits(self):
            return (0, 3)

    wrapped = AddressMappedDiscovery(Limited([DiscoveredHosts(ready={"10.0.0.1": 1})]),
                                     parse_address_map(["10.0.0.0/24=127.0.3.0/24"]))
    assert wrapped.capacity_limits() == (0, 3)


def test_a_script_under_the_wrapper_is_waited_for_up_to_its_own_time_limit(tmp_path):
    """Review of 104e810: a script given -o timeout_s above --discovery-timeout is waited for up to its own
    limit, but behind --address-map the wrapper hid that, and each call was cut at --discovery-timeout."""
    from cloud_elastic.providers.multi import call_limit_s
    from cloud_elastic.providers.script import DiscoveryScript

    script = DiscoveryScript(str(tmp_path / "d.sh"), slots_per_host=1, timeout_s=60.0)
    wrapped = AddressMappedDiscovery(script, parse_address_map(["10.0.0.0/24=127.0.3.0/24"]))
    assert call_limit_s(wrapped, 30.0) == call_limit_s(script, 30.0) == 62.0
    assert call_limit_s(wrapped, 90.0) == 90.0


def test_a_plugin_whose_own_cancel_or_limit_calls_take_other_arguments_is_left_alone_and_a_failing_hook_is_logged(
        caplog):
    """Review of 2437657: the hooks were named cancel() and limit_calls(), names a plugin may well use for its
    own ends (cancel(reason), a rate limit): Ctrl-C then raised TypeError behind --address-map, and a plugin with
    limit_calls(per_minute) could not start a job. They are cancel_find() and find_limit_s() now, and a hook that
    fails is logged, not raised."""
    import logging
    import threading

    from cloud_elastic.driver.runtime.discovery import DiscoveryPoller
    from cloud_elastic.providers.multi import call_limit_s

    class Plugin(ScriptedDiscovery):
        def __init__(self):
            super().__init__([DiscoveredHosts(ready={"10.0.0.1": 1})])
            self.gate, self.asked = threading.Event(), []

        def find(self):
            self.gate.wait(30)
            return super().find()

        def cancel(self, reason):  # the plugin's own
            self.asked.append(("cancel", reason))

        def limit_calls(self, per_minute):  # the plugin's own
            self.asked.append(("limit_calls", per_minute))

    plugin = Plugin()
    wrapped = AddressMappedDiscovery(plugin, parse_address_map(["10.0.0.0/24=127.0.3.0/24"]))
    poller = DiscoveryPoller(wrapped, lambda r: None, interval_s=1.0, call_timeout_s=5)
    try:
        assert poller.poll_once(stopping=lambda: True).message == "the job is stopping"
    finally:
        plugin.gate.set()
        poller.close()
    assert plugin.asked == [] and call_limit_s(wrapped, 30.0) == 30.0

    class Broken(ScriptedDiscovery):
        def cancel_find(self):
            raise RuntimeError("plugin bug")

        def find_limit_s(self, timeout_s):
            return None

    broken = Broken([DiscoveredHosts(ready={"10.0.0.1": 1})])
    with caplog.at_level(logging.WARNING):
        assert call_limit_s(broken, 30.0) == 30.0
        from cloud_elastic.providers.api import cancel_find

        cancel_find(broken)
    assert "cancel_find() failed: plugin bug" in caplog.text and "find_limit_s(30) failed" in caplog.text
