"""Failed logins are bounded per user and client address, per address and per user,
with locks that expire, an event an operator sees, and no lockout of the real user
from an address they have used (a real `ficc serve`, and the throttle on a fake clock).
"""

from __future__ import annotations

import httpx
import pytest
import trio

from ficc_core.auth.throttle import MAX_LOCK_FACTOR, LoginThrottle, LoginThrottled

from ..support.clock import FakeClock
from ..support.serve_support import ServeProcess, first_run_secrets


def _fail(throttle: LoginThrottle, user: str = "alice", address: str = "10.0.0.1") -> None:
    with throttle.attempt(user, address) as record:
        record(False)


def _succeed(throttle: LoginThrottle, user: str = "alice", address: str = "10.0.0.1") -> None:
    with throttle.attempt(user, address) as record:
        record(True)


def _refusal(throttle: LoginThrottle, user: str = "alice", address: str = "10.0.0.1"):
    with pytest.raises(LoginThrottled) as refused:
        with throttle.attempt(user, address):
            pass
    return refused.value


def test_a_pair_is_locked_after_max_failures_until_the_lock_expires():
    clock, locks = FakeClock(), []
    throttle = LoginThrottle(max_failures=3, lockout=60, clock=clock, on_lock=locks.append)
    for _ in range(3):
        _fail(throttle)
    refused = _refusal(throttle)
    assert (refused.status, refused.code) == (429, "login_throttled")
    assert refused.headers["Retry-After"] == "60"
    assert refused.details == {"retry_after": 60, "limit": "user_address"}
    assert locks == ["user_address"]
    clock.now += 59
    _refusal(throttle)
    clock.now += 1
    _succeed(throttle)  # the lock has expired; a success clears the pair
    for _ in range(2):
        _fail(throttle)
    _succeed(throttle)


def test_each_failure_after_a_lock_doubles_it_up_to_the_maximum():
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=1, lockout=10, clock=clock)
    seen = []
    for _ in range(10):
        _fail(throttle)
        seen.append(_refusal(throttle).details["retry_after"])
        clock.now += seen[-1]
    assert seen[:4] == [10, 20, 40, 80]
    assert max(seen) == 10 * MAX_LOCK_FACTOR


def test_a_pair_unheard_for_the_longest_lock_is_forgotten():
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=2, lockout=10, clock=clock)
    _fail(throttle)
    clock.now += 10 * MAX_LOCK_FACTOR + 1
    _fail(throttle)
    _succeed(throttle)  # one failure since it was forgotten: not locked


def test_a_stranger_cannot_lock_the_real_user_out_of_an_address_they_used():
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=2, lockout=60, clock=clock)
    _succeed(throttle, address="home")
    # Guesses from many addresses: each pair locks, then the user as a whole.
    for n in range(8):
        _fail(throttle, address=f"203.0.113.{n // 2}")
    assert _refusal(throttle, address="198.51.100.9").details["limit"] == "user"
    _succeed(throttle, address="home")


def test_one_address_guessing_many_users_is_locked_for_all_of_them():
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=2, lockout=60, clock=clock)
    for n in range(8):
        _fail(throttle, user=f"user{n}", address="203.0.113.7")
    assert _refusal(throttle, user="bob", address="203.0.113.7").details["limit"] == "address"
    _succeed(throttle, user="bob", address="198.51.100.9")


def test_attempts_in_flight_count_so_concurrent_guesses_cannot_overshoot():
    throttle = LoginThrottle(max_failures=2, lockout=60, clock=FakeClock())
    with throttle.attempt("alice", "a"), throttle.attempt("alice", "a"):
        refused = _refusal(throttle, address="a")
    assert refused.details["retry_after"] == 1
    # Both ended without an outcome (an error): they count as nothing.
    _succeed(throttle, address="a")


def _client(url: str, address: str) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=30)


async def _login(http: httpx.AsyncClient, password: str) -> httpx.Response:
    body = {"username": "admin", "password": password, "project": "default"}
    return await http.post("/api/v1/session", json=body)


@pytest.mark.deadline(70)
async def test_serve_bounds_wrong_passwords_per_user_and_address_and_reports_each_lock(tmp_path):
    server = ServeProcess(tmp_path / "data", "--login-max-failures", "3", "--login-lockout", "1h")
    try:
        url = await server.wait_ready()
        token = await server.admin_token()
        password = first_run_secrets(tmp_path / "data" / "first-run-secrets")["admin password"]
        with trio.fail_after(60):
            async with _client(url, "127.0.0.1") as home, _client(url, "127.0.0.2") as stranger:
                assert (await _login(home, password)).status_code == 201
                for _ in range(3):
                    assert (await _login(stranger, "wrong-password")).status_code == 401
                # Locked for that address, even with the right password ...
                refused = await _login(stranger, password)
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "login_throttled"
                assert int(refused.headers["Retry-After"]) > 3500
                # ... but not for the real user elsewhere.
                assert (await _login(home, password)).status_code == 201
                # Guesses spread over addresses lock the user for addresses it never used.
                for n in (3, 4, 5):
                    async with _client(url, f"127.0.0.{n}") as elsewhere:
                        for _ in range(3):
                            assert (await _login(elsewhere, "wrong")).status_code == 401
                async with _client(url, "127.0.0.6") as new_address:
                    refused = await _login(new_address, password)
                assert refused.json()["error"]["details"]["limit"] == "user"
                assert (await _login(home, password)).status_code == 201
                metrics = await home.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert 'ficc_login_lockouts_total{limit="user_address"} 4.0' in metrics.text
        assert 'ficc_login_lockouts_total{limit="user"} 1.0' in metrics.text
        server.proc.terminate()
        await trio.to_thread.run_sync(server.proc.wait, 30)
        log = server.proc.stderr.read()
    finally:
        server.kill()
    # The event an operator sees in the service's log.
    assert "login locked (user_address limit): user 'admin' from 127.0.0.2" in log, log
