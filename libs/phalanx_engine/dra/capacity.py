"""Consumable capacity (``DRAConsumableCapacity``, beta and on in Kubernetes 1.36): how much of
each capacity of a device a request takes, and whether that still fits. Called by
``phalanx_engine.dra.allocate`` for every device it considers.

Upstream's rules (``consumable_capacity.go``, incubating allocator), applied to every device
(not only shared ones):

* a request may only name capacities the device has (else the device is skipped);
* for each capacity of the device the request takes: what it asks, rounded up to the policy
  (``validRange``: at least ``min``, then up to ``min + n*step``; ``validValues``: the first
  value not below it); asking nothing takes the policy's ``default``, or else all of it;
* the amount must keep the policy (``default`` always does; in range: at most ``max`` and on the
  step; else one of the valid values);
* and what the device's shares already hold, plus what this attempt gives it, plus this amount,
  must not exceed its value.

Amounts are nanos (``phalanx_kubeobjects.quantity``); the step rounding is done on them exactly
(upstream rounds through whole units first, which only differs below one unit).
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx_engine.dra.pools import Candidate, CapacityView

_UNITS = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))
_DECIMAL = (("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3))
_NANO = 10**9


def take(cap: CapacityView, asked: int | None) -> int:
    """What a request asking ``asked`` (None: nothing) takes of ``cap``."""
    if asked is None:
        return cap.default if cap.default is not None else cap.value
    if cap.min is not None:
        if asked < cap.min:
            return cap.min
        if cap.step is None:
            return asked
        steps = -(-(asked - cap.min) // cap.step)
        return cap.min + steps * cap.step
    if cap.valid_values:
        return next((v for v in cap.valid_values if asked <= v), asked)
    return asked


def keeps_policy(cap: CapacityView, amount: int) -> bool:
    if cap.default is not None and amount == cap.default:
        return True
    if cap.min is not None:
        if cap.max is not None and amount > cap.max:
            return False
        return cap.step is None or (amount - cap.min) % cap.step == 0
    if cap.valid_values:
        return amount in cap.valid_values
    return True


def fit(device: Candidate, asked: Mapping[str, int], held: Mapping[str, int] | None,
        giving: Mapping[str, int] | None) -> dict[str, int] | None:
    """What the request takes of each of ``device``'s capacities, or None when it cannot:
    it names a capacity the device lacks, breaks a policy, or would overfill it. ``held`` is
    what the device's existing shares hold, ``giving`` what this attempt already gives it."""
    for name in asked:
        if name not in device.capacity:
            return None
    out: dict[str, int] = {}
    for name, cap in device.capacity.items():
        amount = take(cap, asked.get(name))
        if not keeps_policy(cap, amount):
            return None
        total = amount + (held or {}).get(name, 0) + (giving or {}).get(name, 0)
        if total > cap.value:
            return None
        out[name] = amount
    return out


def quantity_text(nanos: int) -> str:
    """A quantity's text: the shorter of whole units with the largest binary suffix dividing
    them (``2Gi``) and with the largest decimal one (``40G``), else plain; fractions in m, u or
    n."""
    if nanos % _NANO == 0:
        units = nanos // _NANO
        forms = [str(units)]
        for suffix, shift in _UNITS:
            if units and units % (1 << shift) == 0:
                forms.append(f"{units >> shift}{suffix}")
                break
        for suffix, power in _DECIMAL:
            if units and units % 10**power == 0:
                forms.append(f"{units // 10**power}{suffix}")
                break
        return min(forms, key=len)
    for suffix, scale in (("m", 10**6), ("u", 10**3)):
        if nanos % scale == 0:
            return f"{nanos // scale}{suffix}"
    return f"{nanos}n"
