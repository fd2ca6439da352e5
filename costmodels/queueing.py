"""Waiting for a free slot: the mean queueing delay in front of ``c`` identical servers.

A serving engine runs at most ``c`` requests at once (its *slots*: the client's
concurrency, the engine's ``max_num_seqs``, and no more than the KV cache holds). A request
that arrives while all ``c`` are busy waits in a queue, first come first served, until one
ends. For an open loop (requests arriving independently of completions, as a Poisson
stream or at a fixed rate) this is a GI/G/c queue, with

* ``a = rate * service`` the offered load in Erlangs, ``rho = a / c`` the load per slot
  (``rho >= 1``: more arrives than ``c`` slots can serve; the queue grows without bound);
* :func:`erlang_c` the probability that an arrival waits in the M/M/c queue (Erlang's C
  formula; L. Kleinrock, *Queueing Systems, Vol. 1: Theory*, Wiley 1975, section 3.5),
  computed through the Erlang-B recursion ``B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1))``,
  ``C = c B / (c - a (1 - B))``, which is stable for thousands of slots;
* :func:`mmc_wait` the M/M/c mean wait ``C(c, a) * service / (c - a)`` (exact);
* :func:`gc_wait` the Allen-Cunneen approximation for GI/G/c (A. O. Allen, *Probability,
  Statistics, and Queueing Theory with Computer Science Applications*, 2nd ed., Academic
  Press 1990): the M/M/c wait scaled by ``(ca2 + cs2) / 2``, with ``ca2`` and ``cs2`` the
  squared coefficients of variation of the interarrival and service times, and with
  Cosmetatos' correction for fixed service times, the factor ``1 + (1 - cs2) * (1 - rho)
  (c - 1) (sqrt(4 + 5c) - 2) / (16 rho c)`` (G. P. Cosmetatos, "Some approximate
  equilibrium results for the multi-server queue (M/G/r)", Operational Research Quarterly
  27, 1976, pp. 615-620; at ``cs2 = 0`` it is his M/D/c formula). It is exact for M/M/c
  (``ca2 = cs2 = 1``) and, at ``c = 1``, for M/G/1 (the Pollaczek-Khinchine formula); for
  Poisson arrivals and fixed service times (M/D/c, ``ca2 = 1, cs2 = 0``), the serving
  case, it is within a few per cent of a discrete-event simulation of the slots
  (``tests/test_arrivals.py``) where anyone waits noticeably; with both fixed (D/D/c)
  nobody waits below ``rho = 1``, as it says.

Seconds throughout; an unstable queue's wait is ``math.inf``.
"""

from __future__ import annotations

import math


def _check(c: int, a: float) -> None:
    if int(c) != c or c < 1:
        raise ValueError(f"servers must be a positive integer, got {c!r}")
    if not (a >= 0.0 and math.isfinite(a)):
        raise ValueError(f"offered load must be a finite number >= 0 (Erlangs), got {a!r}")


def erlang_b(c: int, a: float) -> float:
    """Blocking probability of ``c`` servers offered ``a`` Erlangs with no queue (Erlang's
    B formula), by the recursion in the module docstring."""
    _check(c, a)
    b = 1.0
    for k in range(1, int(c) + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits (all ``c`` servers busy) in an M/M/c queue offered
    ``a`` Erlangs (Erlang's C formula); 1 when ``a >= c`` (unstable: everyone waits)."""
    _check(c, a)
    if a >= c:
        return 1.0
    b = erlang_b(c, a)
    return c * b / (c - a * (1.0 - b))


def mmc_wait(c: int, rate: float, service_s: float) -> float:
    """Mean wait in queue (s) of an M/M/c queue: ``C(c, a) * service / (c - a)``, ``a =
    rate * service``; ``inf`` when ``a >= c``."""
    a = float(rate) * float(service_s)
    _check(c, a)
    if a >= c:
        return math.inf
    return erlang_c(c, a) * service_s / (c - a)


def gc_wait(c: int, rate: float, service_s: float, ca2: float = 1.0, cs2: float = 0.0) -> float:
    """Mean wait in queue (s) of a GI/G/c queue by the Allen-Cunneen approximation with
    Cosmetatos' fixed-service correction (module docstring): ``mmc_wait * (ca2 + cs2) / 2
    * (1 + (1 - cs2) * delta)``. ``ca2``: squared coefficient of variation of the
    interarrival times (Poisson 1, a fixed rate 0); ``cs2``: of the service times, 0..1
    (fixed 0, exponential 1). ``inf`` when ``rate * service >= c``."""
    if ca2 < 0 or not 0 <= cs2 <= 1:
        raise ValueError(f"expected ca2 >= 0 and 0 <= cs2 <= 1, got {ca2}, {cs2}")
    w = mmc_wait(c, rate, service_s)
    if math.isinf(w) or w == 0.0:
        return w
    rho = rate * service_s / c
    delta = (1.0 - rho) * (c - 1.0) * (math.sqrt(4.0 + 5.0 * c) - 2.0) / (16.0 * rho * c)
    return w * (ca2 + cs2) / 2.0 * (1.0 + (1.0 - cs2) * delta)
