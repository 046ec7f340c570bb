"""DRA CEL selectors (``phalanx_engine.dra.celenv``, ``phalanx_engine.dra.semver``): the Kubernetes
device environment, its quantity and semver libraries, and which failures are errors rather than
"does not match"."""

from __future__ import annotations

import pytest

from phalanx_engine.dra import semver
from phalanx_engine.dra.celenv import ENV, CelCompileError, CelEnv, CelRuntimeError
from phalanx_proto.dra import AttrValue, Capacity, Device


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


# A full GPU and a MIG device as dra-driver-nvidia-gpu publishes them (unqualified names are the
# driver's domain).
A100 = Device(name="gpu-0", attributes={
    "type": AttrValue(string="gpu"),
    "uuid": AttrValue(string="GPU-2fa81118-5a5f-aa66-7660-471eed407181"),
    "productName": AttrValue(string="NVIDIA A100-SXM4-80GB"),
    "architecture": AttrValue(string="Ampere"),
    "cudaComputeCapability": AttrValue(version="8.0.0"),
    "driverVersion": AttrValue(version="580.126.20"),
    "resource.kubernetes.io/pciBusID": AttrValue(string="0000:65:00.0"),
    "resource.kubernetes.io/pcieRoot": AttrValue(string="pci0000:64"),
    "resource.kubernetes.io/numaNode": AttrValue(int_=0),
    "gpu.nvidia.com/mig": AttrValue(bool_=False),
}, capacity={"memory": Capacity(value="80Gi")})
MIG = Device(name="gpu-0-mig-1g10gb-19-0", attributes={
    "type": AttrValue(string="mig"), "profile": AttrValue(string="1g.10gb"),
    "productName": AttrValue(string="NVIDIA A100-SXM4-80GB"), "driverVersion": AttrValue(version="580.126.20"),
}, capacity={"memory": Capacity(value="9856Mi"), "multiprocessors": Capacity(value="14")})
NIC = Device(name="nic-0", attributes={"resource.kubernetes.io/pcieRoot": AttrValue(string="pci0000:64")})

GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"


def matches(expression: str, device: Device = A100, driver: str = "gpu.nvidia.com", env: CelEnv = ENV) -> bool:
    return env.matches(env.compile(expression), env.device_input(driver, device))


@pytest.mark.parametrize("case,expression,want", cases(
    ("the driver is a field of the device", 'device.driver == "gpu.nvidia.com"', True),
    ("an unqualified attribute is in the driver's domain", 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"', True),
    ("a qualified attribute is in its own domain", 'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:64"', True),
    ("an attribute named with the driver's domain joins the bare ones", 'device.attributes["gpu.nvidia.com"].mig == false', True),
    ("an int attribute equals a double of the same value", 'device.attributes["resource.kubernetes.io"].numaNode == 0.0', True),
    ("the NVIDIA GPU class selects a full GPU", GPU_CLASS, True),
    ("the NVIDIA MIG class does not select a full GPU", MIG_CLASS, False),
    ("'in' finds an attribute of the domain", '"productName" in device.attributes["gpu.nvidia.com"]', True),
    ("has() is false for an attribute the device lacks", 'has(device.attributes["gpu.nvidia.com"].nonexistent)', False),
    ("an unknown domain is an empty map", 'device.attributes["example.com"].size() == 0', True),
    ("an unknown capacity domain is an empty map", '"x" in device.capacity["example.com"]', False),
    ("allowMultipleAllocations is false unless the device says so", "device.allowMultipleAllocations == false", True),
    ("memory compares with a quantity", 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
    ("quantities are equal by value", 'device.capacity["gpu.nvidia.com"].memory == quantity("81920Mi")', True),
    ("isGreaterThan on quantities", 'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("80G"))', True),
    ("isLessThan on quantities", 'quantity("40Gi").isLessThan(device.capacity["gpu.nvidia.com"].memory)', True),
    ("asInteger gives the value in units", 'device.capacity["gpu.nvidia.com"].memory.asInteger() == 85899345920', True),
    ("isInteger is false for a fraction", 'quantity("1.5").isInteger() == false && quantity("2k").isInteger()', True),
    ("asApproximateFloat of a milli value", 'quantity("1500m").asApproximateFloat() == 1.5', True),
    ("add and sub take quantities and ints", 'quantity("50k").add(quantity("20k")) == quantity("70k") && quantity("50k").sub(20000) == quantity("30k")', True),
    ("sign is a global function", 'sign(quantity("-1m")) == -1 && sign(quantity("0")) == 0', True),
    ("isQuantity knows the grammar", 'isQuantity("1.3Gi") && !isQuantity("200K") && !isQuantity(" 1")', True),
    ("a version attribute compares with semver()", 'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("575.0.0"))', True),
    ("compareTo on versions", 'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) == 0', True),
    ("major, minor and patch", 'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3', True),
    ("a pre-release ranks below its release", 'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
    ("build metadata does not take part in equality", 'semver("1.0.0+b1") == semver("1.0.0+b2")', True),
    ("normalize strips v and leading zeros and pads", 'semver("v01.2", true) == semver("1.2.0") && !isSemver("v1.2") && isSemver("01.2.3", true)', True),
    ("cel.bind names a domain once", 'cel.bind(g, device.attributes["gpu.nvidia.com"], g.type == "gpu" && g.architecture == "Ampere")', True),
    ("the strings extension lowers and matches", "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')", True),
    ("optional types give a default", 'device.attributes["gpu.nvidia.com"].?power.orValue(400) == 400', True),
    ("|| absorbs an error when the other side is true", 'device.attributes["gpu.nvidia.com"].bogus == 1 || true', True),
    ("&& absorbs an error when the other side is false", 'false && device.attributes["gpu.nvidia.com"].bogus == 1', False),
    ("a comprehension works over a list", "[1, 2, 3].exists(x, x == 2)", True),
))
def test_a_selector_on_an_nvidia_gpu(case: str, expression: str, want: bool) -> None:
    assert matches(expression) is want


@pytest.mark.parametrize("case,expression,device,driver,want", cases(
    ("the MIG class selects a MIG device", MIG_CLASS, MIG, "gpu.nvidia.com", True),
    ("the GPU class does not select a MIG device", GPU_CLASS, MIG, "gpu.nvidia.com", False),
    ("the GPU class is false, not an error, on another driver's device", GPU_CLASS, NIC, "nic.example.com", False),
    ("a device without attributes of its driver has an empty driver domain",
     "device.attributes[device.driver].size() == 0", NIC, "nic.example.com", True),
    ("MIG memory is in the driver's capacity domain", 'device.capacity["gpu.nvidia.com"].memory == quantity("9856Mi")',
     MIG, "gpu.nvidia.com", True),
))
def test_a_selector_on_other_devices(case: str, expression: str, device: Device, driver: str, want: bool) -> None:
    assert matches(expression, device, driver) is want


@pytest.mark.parametrize("case,expression,message", cases(
    ("a missing key in a known domain", 'device.attributes["gpu.nvidia.com"].bogus == 1', "no such key: bogus"),
    ("a missing key in an unknown domain", 'device.attributes["example.com"].x == 1', "no such key: x"),
    ("asInteger of a fraction", 'quantity("1.5").asInteger() == 1', "cannot convert value to integer"),
    ("asInteger beyond int64", 'quantity("10E").asInteger() == 1', "cannot convert value to integer"),
    ("a quantity that does not parse", 'quantity("1 Gi").isInteger()',
     "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': '1 Gi'"),
    ("a version that does not parse", 'semver("v1.2.3").major() == 1',
     "'v1.2.3' is not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD])"),
    ("a quantity compared with a version", 'quantity("1").compareTo(semver("1.0.0")) == 0', "no such overload: not a quantity"),
    ("a dynamic result that is not a bool", 'device.attributes["gpu.nvidia.com"].productName',
     "CEL result of type string could not be converted to bool"),
    ("a string plus an int", 'device.attributes["gpu.nvidia.com"].productName + 1 == 2',
     "no such overload: _+_(string, int64)"),
))
def test_a_runtime_error_is_an_error_not_a_mismatch(case: str, expression: str, message: str) -> None:
    with pytest.raises(CelRuntimeError) as got:
        matches(expression)
    assert str(got.value) == message


@pytest.mark.parametrize("case,expression,message", cases(
    ("an int result", "1", "must evaluate to bool or the unknown type, not int"),
    ("a string result", '"gpu"', "must evaluate to bool or the unknown type, not string"),
    ("a quantity result", 'quantity("1")', "must evaluate to bool or the unknown type, not map<dyn, dyn>"),
))
def test_a_selector_that_is_not_a_bool_does_not_compile(case: str, expression: str, message: str) -> None:
    with pytest.raises(CelCompileError) as got:
        ENV.compile(expression)
    assert str(got.value) == message


def test_a_syntax_error_does_not_compile_and_says_where() -> None:
    with pytest.raises(CelCompileError) as got:
        ENV.compile("device.driver ==")
    assert str(got.value).startswith("compilation failed: ERROR: <input>:1:")


def test_an_undeclared_function_does_not_compile() -> None:
    with pytest.raises(CelCompileError, match="undeclared reference to 'foo'"):
        ENV.compile("device.driver.foo()")


def test_a_version_attribute_that_is_not_semver_makes_every_selector_fail_on_that_device() -> None:
    bad = Device(name="gpu-9", attributes={"driverVersion": AttrValue(version="580.126"),
                                           "type": AttrValue(string="gpu")})
    with pytest.raises(CelRuntimeError) as got:
        matches('device.driver == "gpu.nvidia.com"', bad)
    assert str(got.value) == ("attribute driverVersion: parse semantic version: "
                              "'580.126' is not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD])")


def test_an_attribute_without_a_value_makes_every_selector_fail_on_that_device() -> None:
    bad = Device(name="gpu-9", attributes={"odd": AttrValue()})
    with pytest.raises(CelRuntimeError, match="^attribute odd: unsupported attribute value$"):
        matches("true", bad)


def test_compiling_is_cached_by_text_and_bounded() -> None:
    env = CelEnv(max_expressions=2)
    first = env.compile("true")
    assert env.compile("true") is first
    env.compile("false")
    env.compile("1 == 1")  # pushes "true" out
    assert env.compile("true") is not first


def test_a_compile_error_is_cached_too() -> None:
    env = CelEnv(max_expressions=2)
    with pytest.raises(CelCompileError) as a:
        env.compile("1")
    with pytest.raises(CelCompileError) as b:
        env.compile("1")
    assert a.value is b.value


def test_a_domain_first_named_by_a_later_selector_is_an_empty_map_on_a_device_evaluated_before() -> None:
    env = CelEnv()
    device = env.device_input("nic.example.com", NIC)
    assert env.matches(env.compile("true"), device) is True
    assert env.matches(env.compile('device.attributes["late.example.com"].size() == 0'), device) is True


def test_each_device_keeps_each_selectors_answer() -> None:
    env = CelEnv()
    device = env.device_input("gpu.nvidia.com", A100)
    selector = env.compile(GPU_CLASS)
    assert [env.matches(selector, device) for _ in range(3)] == [True, True, True]
    assert device._answers == {GPU_CLASS: True}


# --- semantic versions -------------------------------------------------------------------------------


@pytest.mark.parametrize("case,text,normalize,want", cases(
    ("a plain version", "1.2.3", False, semver.Semver(1, 2, 3)),
    ("a pre-release", "1.2.3-rc.1", False, semver.Semver(1, 2, 3, ("rc", "1"))),
    ("build metadata is dropped", "1.2.3+build.5", False, semver.Semver(1, 2, 3)),
    ("normalize strips the v", "v1.2.3", True, semver.Semver(1, 2, 3)),
    ("normalize pads a short version", "1.2", True, semver.Semver(1, 2, 0)),
    ("normalize pads a major alone", "7", True, semver.Semver(7, 0, 0)),
    ("normalize strips leading zeros", "01.002.0003", True, semver.Semver(1, 2, 3)),
    ("normalize keeps a zero", "00.0.00", True, semver.Semver(0, 0, 0)),
))
def test_a_version_parses(case: str, text: str, normalize: bool, want: semver.Semver) -> None:
    assert semver.parse(text, normalize) == want


@pytest.mark.parametrize("case,text,normalize", cases(
    ("a v prefix without normalize", "v1.2.3", False),
    ("two components without normalize", "1.2", False),
    ("a leading zero without normalize", "01.2.3", False),
    ("a numeric pre-release with a leading zero", "1.2.3-01", False),
    ("an empty pre-release identifier", "1.2.3-rc..1", False),
    ("an empty text", "", False),
    ("a short version with a pre-release", "1.2-rc", True),
    ("letters", "one.two.three", False),
))
def test_a_version_does_not_parse(case: str, text: str, normalize: bool) -> None:
    with pytest.raises(semver.SemverError):
        semver.parse(text, normalize)
    assert semver.is_semver(text, normalize) is False


def test_versions_sort_by_semver_precedence() -> None:
    texts = ["1.0.0", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "0.9.9", "1.0.1", "1.10.0", "1.9.0"]
    import functools
    ordered = sorted(texts, key=functools.cmp_to_key(lambda a, b: semver.parse(a).compare(semver.parse(b))))
    assert ordered == ["0.9.9", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
                       "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.9.0", "1.10.0"]
