#!/bin/bash
# Writes reward.json: reward 1 when the output matches line for line, and the share of right lines as a component.
cd /app
python3 /tests/grade.py /app/fizzbuzz.py > /logs/verifier/reward.json
cat /logs/verifier/reward.json
