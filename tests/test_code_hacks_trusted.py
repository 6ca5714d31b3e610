"""The scoring process against a completion that attacks it: the tests run here, on data and handles the sandboxed
code sends back, so what it sends must never crash, hang or exhaust the trainer.

Black-box: only `CodeExecution(timeout=..., workers=...)(prompts=..., completions=..., tests=...)` and its
`last_details`. A scoring call that may hang runs in a child process with a wall-clock limit, so a hang is a failure
of the test, not of the suite: every completion's score must come back within its `timeout` and a few seconds.
Each hostile completion pairs a wrong answer with the attack, so it must score exactly 0.0; a correct and a wrong
control in the same call prove the call is live.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewards.code import CodeExecution

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 5.0
SLACK = 12.0  # the sandbox's own backstops (kill, cleanup, a fresh sandbox) and this child's start
guards = pytest.mark.guards

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]
RIGHT_ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
CALLBACK_TESTS = ["assert apply(lambda v: v + 1, 1) == 3", "assert apply(lambda v: v * 2, 3) == 12"]
RIGHT_APPLY = "def apply(f, x):\n    return f(f(x))\n"
WRONG_APPLY = "def apply(f, x):\n    return f(x)\n"

# The child: scores one batch and prints [values, seconds]; argv[1] is JSON [completions, tests, workers].
SCORER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from rewards.code import CodeExecution
completions, tests, workers = json.loads(sys.argv[1])
component = CodeExecution(timeout=__TIMEOUT__, workers=workers)
start = time.monotonic()
values = component(prompts=[""] * len(completions), completions=completions, tests=tests)
print(json.dumps([values, time.monotonic() - start, [d.get("status") for d in component.last_details]]))
""".replace("__TIMEOUT__", repr(TIMEOUT))


def _start(rows: list[tuple[str, list[str]]]) -> subprocess.Popen:
    """A scoring call of `rows` [(completion, tests)] in a child process, all completions at once."""
    payload = json.dumps([[code for code, _ in rows], [tests for _, tests in rows], len(rows)])
    return subprocess.Popen([sys.executable, "-c", SCORER, payload, str(ROOT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _finish(child: subprocess.Popen, started: float) -> tuple[list, float, list]:
    limit = TIMEOUT + SLACK
    try:
        out, err = child.communicate(timeout=max(1.0, started + limit - time.monotonic()))
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"the scoring call did not come back within {limit:.0f} s (timeout {TIMEOUT:.0f} s): the "
                    "trainer would hang here")
    assert child.returncode == 0, f"the scoring call crashed: {err[-2000:]}"
    values, seconds, statuses = json.loads(out.strip().splitlines()[-1])
    return values, seconds, statuses


# -----------------------------------------------------------------------------------------------------------------
# Hostile completions, each scored in its own child (a hang in one must not hide another), all started at once
# -----------------------------------------------------------------------------------------------------------------

# A reply frame written straight to the result channel: a set of 200,000 ints whose hashes all collide (multiples of
# 2**61 - 1 hash to 0), so building it where the reply is decoded takes quadratic time, holding the GIL.
COLLIDING_SET = r'''
import json, os, struct
def add(a, b):
    prime = (1 << 61) - 1
    value = ["S", [["i", hex(k * prime)] for k in range(1, 200001)]]
    data = json.dumps({"value": value}).encode()
    os.write(3, struct.pack(">I", len(data)) + data)
    os._exit(0)
'''

# The same, as the keys of a dict the names reply says the code defines (decoded before any test runs).
COLLIDING_NAMES = r'''
import json, os, struct
import __main__ as _worker
_write_real = _worker.write_frame
def _write(fd, message):
    if type(message) is dict and "names" in message:
        prime = (1 << 61) - 1
        value = ["d", [[["i", hex(k * prime)], ["N"]] for k in range(1, 200001)]]
        data = json.dumps({"names": {"add": ["data", value]}}).encode()
        os.write(fd, struct.pack(">I", len(data)) + data)
        return
    return _write_real(fd, message)
_worker.write_frame = _write
def add(a, b):
    return a - b
'''

# An ordinary checker of the tests (trial division) applied here to the value the code returned: a product of two
# large primes keeps it busy for years.
PRIME_TESTS = ["def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
               "assert is_prime(next_prime(10)) and next_prime(10) == 11",
               "assert is_prime(next_prime(20))"]
HUGE_COMPOSITE = "def next_prime(n):\n    return ((1 << 61) - 1) * ((1 << 89) - 1)\n"
RIGHT_PRIME = ("def next_prime(n):\n    n += 1\n    while any(n % d == 0 for d in range(2, int(n ** 0.5) + 1)):\n"
               "        n += 1\n    return n\n")

# A callable of the standard library the tests hand over as a callback: the code calls it here with an argument of
# its choosing (a factorial of 10**8 runs for minutes, in C, holding the GIL).
FACTORIAL_TESTS = ["import math\nassert apply(math.factorial, 5) == 120", "assert apply(abs, -3) == 3"]
FACTORIAL_CALLER = "def apply(f, x):\n    f(10 ** 8)\n    return f(x) + 1\n"

# Attacks the design already answers (kept as regressions): half a frame then silence, a flood on the channel, a
# callback called 100,000 times or from a thread after the call returned, exceptions named like BaseExceptions.
TRICKLE = r'''
import os, struct, time
def add(a, b):
    os.write(3, struct.pack(">I", 8 << 20) + b'{"value": ')
    while True:
        os.write(3, b" ")
        time.sleep(0.5)
'''
FLOOD = r'''
import os
def add(a, b):
    chunk = b"[" * (1 << 20)
    for _ in range(40):
        os.write(3, chunk)
    return a - b
'''
CALLBACK_STORM = r'''
def apply(f, x):
    for _ in range(100000):
        f(x)
    return f(x)
'''
CALLBACK_LATER = r'''
import threading, time
def apply(f, x):
    def later():
        time.sleep(0.2)
        for _ in range(50):
            try:
                f(x)
            except BaseException:
                pass
    threading.Thread(target=later, daemon=True).start()
    return f(x)
'''
NAMED_LIKE_BASE = r'''
class KeyboardInterrupt(Exception):
    pass
class SystemExit(Exception):
    pass
def apply(f, x):
    if x == 1:
        raise KeyboardInterrupt("stop the trainer")
    raise SystemExit(0)
'''

CASES = {
    "colliding_set": [(COLLIDING_SET, ADD_TESTS), (RIGHT_ADD, ADD_TESTS), (WRONG_ADD, ADD_TESTS)],
    "colliding_names": [(COLLIDING_NAMES, ADD_TESTS), (RIGHT_ADD, ADD_TESTS), (WRONG_ADD, ADD_TESTS)],
    "prime_checker": [(HUGE_COMPOSITE, PRIME_TESTS), (RIGHT_PRIME, PRIME_TESTS),
                      ("def next_prime(n):\n    return n + 2\n", PRIME_TESTS[:2])],
    "builtin_callback": [(FACTORIAL_CALLER, FACTORIAL_TESTS), ("def apply(f, x):\n    return f(x)\n", FACTORIAL_TESTS),
                         ("def apply(f, x):\n    return f(x) + 1\n", FACTORIAL_TESTS)],
    "answered": [(TRICKLE, ADD_TESTS), (FLOOD, ADD_TESTS), (CALLBACK_STORM, CALLBACK_TESTS),
                 (CALLBACK_LATER, CALLBACK_TESTS), (NAMED_LIKE_BASE, CALLBACK_TESTS),
                 (RIGHT_APPLY, CALLBACK_TESTS), (WRONG_APPLY, CALLBACK_TESTS)],
}
# [hostile..., right control, wrong control] per case: what each must score
EXPECTED = {"colliding_set": [0.0, 1.0, 0.0], "colliding_names": [0.0, 1.0, 0.0], "prime_checker": [0.0, 1.0, 0.0],
            "builtin_callback": [0.0, 1.0, 0.0],
            "answered": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]}


@pytest.fixture(scope="module")
def children():
    """Every case's scoring call, started together: the slowest bounds this module's time."""
    started = time.monotonic()
    running = {name: _start(rows) for name, rows in CASES.items()}
    yield running, started
    for child in running.values():
        if child.poll() is None:
            child.kill()
            child.communicate()


def _check(name: str, children) -> None:
    running, started = children
    values, seconds, statuses = _finish(running[name], started)
    assert values == EXPECTED[name], f"{name}: scores {values} (statuses {statuses}), expected {EXPECTED[name]}"
    assert seconds < TIMEOUT + SLACK, f"{name}: the call took {seconds:.1f} s"


@guards("a reply holding a set of ints whose hashes collide neither hangs the scoring call nor holds the trainer")
def test_a_set_with_colliding_hashes_does_not_hang_the_call(children):
    _check("colliding_set", children)


@guards("a names reply holding a dict of colliding keys neither hangs the scoring call nor holds the trainer")
def test_a_names_reply_with_colliding_keys_does_not_hang_the_call(children):
    _check("colliding_names", children)


@guards("a test's own checker run here on a value the code chose (trial division of a huge number) is bounded by "
        "the time limit")
def test_a_checker_of_the_tests_on_a_huge_value_is_bounded_by_the_time_limit(children):
    _check("prime_checker", children)


@guards("a standard-library callable the tests pass as a callback, called by the code with a huge argument, is "
        "bounded by the time limit")
def test_a_library_callback_called_with_a_huge_argument_is_bounded_by_the_time_limit(children):
    _check("builtin_callback", children)


@guards("half a frame, a flood on the channel, a callback storm, a callback from a thread after the call returned, "
        "and exceptions named like KeyboardInterrupt / SystemExit neither crash nor stall the call")
def test_protocol_abuse_is_answered_within_the_time_limit(children):
    _check("answered", children)


# -----------------------------------------------------------------------------------------------------------------
# A malformed names reply (in this process: an exception here is what the trainer would get)
# -----------------------------------------------------------------------------------------------------------------

MALFORMED_NAMES = r'''
import __main__ as _worker
_write_real = _worker.write_frame
def _write(fd, message):
    if type(message) is dict and "names" in message:
        message = {"names": {name: __SHAPE__ for name in message["names"]}}
    return _write_real(fd, message)
_worker.write_frame = _write
def add(a, b):
    return a - b
'''


@guards("a names reply of the wrong shape scores the completion 0 and never raises out of the reward call")
def test_a_malformed_names_reply_does_not_crash_the_reward_call():
    hostile = [MALFORMED_NAMES.replace("__SHAPE__", shape) for shape in ("5", "[]", "None", '"call"')]
    component = CodeExecution(timeout=TIMEOUT, workers=2)
    completions = [*hostile, RIGHT_ADD, WRONG_ADD]
    try:
        values = component(prompts=[""] * len(completions), completions=completions,
                           tests=[ADD_TESTS] * len(completions))
    except Exception as err:  # noqa: BLE001 (what the trainer would see)
        pytest.fail(f"the reward call raised {type(err).__name__}: {err}")
    assert values == [0.0] * len(hostile) + [1.0, 0.0], (values, component.last_details)
