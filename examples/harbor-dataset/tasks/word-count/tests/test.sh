#!/bin/bash
# 1 when top_words.py prints the expected three lines for a text it never saw, else 0.
expected=$'the 5\ncat 4\ndog 3'
got=$(cd /app && timeout 20 python3 /app/top_words.py /tests/sample.txt 2>&1)
echo "$got"
if [ "$got" = "$expected" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
