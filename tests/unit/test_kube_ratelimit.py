"""The Kubernetes adapter's client-side rate limiter: client-go's token bucket meaning of
``--kube-api-qps`` and ``--kube-api-burst``, on a fake clock."""

from __future__ import annotations

import pytest

from phalanx_kube.ratelimit import KubeClientSettings, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("case", "qps", "burst", "requests", "waits"), [
    ("a burst goes out at once, then one request per 1/qps", 2.0, 3, [(0.0, 5)], [0, 0, 0, 0.5, 1.0]),
    ("the bucket refills at qps up to the burst, never beyond", 2.0, 3, [(0.0, 3), (10.0, 4)], [0, 0, 0, 0, 0, 0, 0.5]),
    ("a partly refilled bucket serves what it has, then queues", 10.0, 5, [(0.0, 5), (0.2, 3)], [0, 0, 0, 0, 0, 0, 0, 0.1]),
    ("a burst of one is a plain rate", 4.0, 1, [(0.0, 3)], [0, 0.25, 0.5]),
])
def test_reservations_wait_in_order_for_their_token(case, qps, burst, requests, waits):
    clock = Clock()
    bucket = TokenBucket(qps, burst, clock=clock)
    got = []
    for at, count in requests:
        clock.now = 100.0 + at
        got += [round(bucket.reserve(), 6) for _ in range(count)]
    assert got == waits


def test_a_cancelled_reservation_gives_its_token_back():
    clock = Clock()
    bucket = TokenBucket(1.0, 1, clock=clock)
    assert bucket.reserve() == 0
    assert bucket.reserve() == 1.0
    bucket.cancel()
    assert bucket.reserve() == 1.0


@pytest.mark.parametrize(("case", "settings", "pool", "limited"), [
    ("kube-scheduler's defaults", KubeClientSettings(), 108, True),
    ("a raised limit sizes the pool to its burst", KubeClientSettings(qps=5000, burst=2000), 2008, True),
    ("qps 0 turns the limiter off", KubeClientSettings(qps=0), 108, False),
    ("an explicit pool size wins", KubeClientSettings(burst=10, connections=4), 4, True),
])
def test_settings_derive_the_connection_pool_and_the_limiter(case, settings, pool, limited):
    assert (settings.pool_size, settings.limiter() is not None) == (pool, limited)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"qps": float("inf")}, "qps must be a finite number"),
    ({"burst": 0}, "burst must be at least 1"),
    ({"connections": -1}, "connections must be 0"),
])
def test_impossible_settings_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KubeClientSettings(**kwargs)


@pytest.mark.parametrize(("argv", "qps", "burst"), [
    (["run", "binder"], 50.0, 100),
    (["run", "placement", "--kube-api-qps", "5000", "--kube-api-burst", "2000"], 5000.0, 2000),
    (["run", "gang-coordinator", "--kube-api-qps", "0"], 0.0, 100),
])
def test_phalanx_run_takes_the_limits_as_flags(argv, qps, burst):
    from phalanx_cli.main import build_parser

    args = build_parser().parse_args(argv)
    assert (args.kube_api_qps, args.kube_api_burst) == (qps, burst)


@pytest.mark.parametrize("argv", [
    ["--kube-api-qps", "-1"], ["--kube-api-qps", "nan"], ["--kube-api-qps", "lots"],
    ["--kube-api-burst", "0"], ["--kube-api-burst", "٤"], ["--kube-api-burst", "1.5"],
])
def test_phalanx_run_refuses_an_impossible_limit_with_exit_2(argv, capsys):
    from phalanx_cli.main import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "binder", *argv])
    assert exit_.value.code == 2
    assert "must be" in capsys.readouterr().err
