"""The OCS drivers by name (controller/drivers/registry.py): each listed module declares its driver, a rack file's
entry is checked by its driver, the controller's options come from the drivers' settings, and a new driver is one
module and one line. And no module of the controller outside controller/drivers/ names a driver by its string."""
from __future__ import annotations

import ast
import sys
import textwrap
from types import SimpleNamespace

import pytest

from controller.drivers import registry
from tests.unit.test_architecture import MODULES, _under


def _entry(driver: str, address: str | None = None, name: str = "ocs1"):
    return SimpleNamespace(name=name, driver=driver, address=address, ports=32, switching_time_ms=25.0,
                           reconfiguration_time_ms=None, bulk_time_ms=25.0, dpid=1)


def test_every_listed_module_declares_the_driver_it_is_listed_as():
    assert registry.names() == list(registry.DRIVERS) and registry.DEFAULT in registry.DRIVERS
    for name in registry.names():
        kind = registry.kind(name)
        assert kind.name == name and kind.summary


def test_an_unknown_driver_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown OCS driver 'polatis' \(known: openflow, tl1, netconf\)"):
        registry.check(_entry("polatis"))


@pytest.mark.parametrize("driver, address, error", [
    ("netconf", None, r"driver netconf needs 'address' \(host\[:port\], ssh://"),
    ("tl1", None, r"driver tl1 needs 'address'"),
    ("openflow", "10.0.0.1", r"driver openflow takes no 'address'"),
    ("tl1", "ocs1:port", r"bad TL1 address 'ocs1:port'"),
    ("netconf", "tcp-ncx://127.0.0.1", r"bad NETCONF address"),
    ("netconf", "ssh://ocs1?known_hosts=relative/path", r"known_hosts takes an absolute path"),
])
def test_a_rack_file_entry_is_checked_by_its_driver(driver, address, error):
    with pytest.raises(ValueError, match=error):
        registry.check(_entry(driver, address))


def test_good_entries_pass():
    for driver, address in [("openflow", None), ("tl1", "ocs1.lab:3082"), ("netconf", "ocs1.lab"),
                            ("netconf", "ssh://admin@ocs1.lab:830?known_hosts=/etc/optirack/known_hosts")]:
        registry.check(_entry(driver, address))


def test_the_controller_options_come_from_the_drivers_settings():
    from controller import config

    names = {o.dest for o in config.OPTS}
    for driver, setting in registry.settings():
        assert registry.option_name(driver, setting) in names
    assert {"tl1_user", "tl1_password", "netconf_user", "netconf_password", "netconf_key",
            "netconf_confirm_timeout"} <= names


def test_a_new_driver_is_one_module_and_one_line(tmp_path, monkeypatch):
    (tmp_path / "optirack_test_ocs.py").write_text(textwrap.dedent('''
        from controller.drivers.registry import DriverKind, Setting

        class Made:
            def __init__(self, spec, token, sleep):
                self.spec, self.token, self.sleep = spec, token, sleep

        def check(spec):
            if not spec.address.startswith("https://"):
                raise ValueError("the test driver takes https:// addresses")

        DRIVER = DriverKind("restocs", "a switch behind a REST API (a test's)", address="https://host",
                            check=check, build=lambda spec, w: Made(spec, w.settings["token"], w.sleep),
                            settings=(Setting("token", "", "the API token", secret=True),))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.DRIVERS, "restocs", "optirack_test_ocs")  # the one line
    try:
        conf = SimpleNamespace(restocs_token="s3cret")
        made = registry.build(_entry("restocs", "https://ocs1.lab"), conf)
        assert made.token == "s3cret" and made.spec.name == "ocs1"
        assert ("restocs", registry.kind("restocs").settings[0]) in registry.settings()
        with pytest.raises(ValueError, match="takes https://"):
            registry.check(_entry("restocs", "ocs1.lab"))
    finally:
        sys.modules.pop("optirack_test_ocs", None)


def test_a_module_that_declares_another_name_is_caught(monkeypatch):
    monkeypatch.setitem(registry.DRIVERS, "tl2", "controller.drivers.tl1")
    with pytest.raises(RuntimeError, match="declares driver 'tl1', listed as 'tl2'"):
        registry.kind("tl2")


def test_declaring_the_drivers_loads_no_ryu():
    """A rack file is read by the simulator too, which has no Ryu: the registry and every declaring module import none
    (in a fresh interpreter)."""
    import subprocess

    from tests.unit.test_architecture import ROOT

    code = ("import sys; from controller.drivers import registry; [registry.kind(n) for n in registry.names()]; "
            "print(sorted({'ryu', 'eventlet'} & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _names_a_driver(path) -> list[str]:
    names = set(registry.names())
    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]


def test_no_module_of_the_controller_outside_the_drivers_names_a_driver():
    """The rack file's schema, the keeper, the options and the apps ask the registry; a driver's name is written in
    controller/drivers/ alone."""
    found = {m: hits for m, p in MODULES.items()
             if _under(m, "controller") and not _under(m, "controller.drivers")
             and (hits := _names_a_driver(p))}
    assert not found, found


def test_the_check_finds_a_driver_named_by_its_string(tmp_path):
    """The check above can fail: a module that compares a spec's driver with "netconf" is found."""
    bad = tmp_path / "bad.py"
    bad.write_text('def build(spec):\n    return 1 if spec.driver == "netconf" else 2\n')
    assert _names_a_driver(bad) == ["line 2: 'netconf'"]


def test_a_rack_file_with_an_unknown_driver_names_the_field_and_the_drivers():
    import yaml

    from controller.core.rack import RackError, parse_rack
    from tests.unit.test_rack import PAPER

    data = yaml.safe_load(PAPER.read_text())
    data["ocs"][0]["driver"] = "polatis"
    known = r"\(known: openflow, tl1, netconf\)"
    with pytest.raises(RackError, match=r"rack.yaml: ocs\[0\]: unknown OCS driver 'polatis' " + known):
        parse_rack(data, "rack.yaml")
