"""Runs the candidate and compares its output with the expected lines; prints the reward JSON."""

import json
import subprocess
import sys

expected = [
    "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)
    for n in range(1, 101)
]
try:
    out = subprocess.run(
        [sys.executable, sys.argv[1]], capture_output=True, text=True, timeout=20
    ).stdout.splitlines()
except Exception:
    out = []
right = sum(1 for a, b in zip(out, expected, strict=False) if a.strip() == b)
print(json.dumps({"reward": 1.0 if out == expected else 0.0, "lines_right": right / len(expected)}))
