"""A batch's divisors from its prime factors (Miller-Rabin and Pollard's rho): the microbatch counts
a pipeline can take, found at once for any batch a 64-bit integer holds (a walk to the batch is not)."""

from __future__ import annotations

import math


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the bases that decide every n below 3.3e24 (any batch a 64-bit integer holds)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _factor(n: int) -> list[int]:
    """The prime factors of n (with multiplicity): small ones by trial division, the rest by
    Pollard's rho (Brent's cycle finding): milliseconds for any 64-bit n."""

    out: list[int] = []
    for p in range(2, 1000):
        while n % p == 0:
            out.append(p)
            n //= p
    todo = [n] if n > 1 else []
    while todo:
        m = todo.pop()
        if _is_prime(m):
            out.append(m)
            continue
        c = 1
        while True:   # Pollard-Brent: a non-trivial divisor of the composite m
            x = y = 2
            g = 1
            while g == 1:
                x = (x * x + c) % m
                y = (y * y + c) % m
                y = (y * y + c) % m
                g = math.gcd(abs(x - y), m)
            if g != m:
                break
            c += 1
        todo += [g, m // g]
    return sorted(out)


def divisors(n: int) -> list[int]:
    """Every divisor of n >= 1, ascending, from its prime factors (not a walk up to n)."""
    divs = [1]
    factors = _factor(n)
    for p in sorted(set(factors)):
        k = factors.count(p)
        divs = [d * p**e for d in divs for e in range(k + 1)]
    return sorted(divs)
