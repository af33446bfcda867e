#!/bin/bash
# 1 when /app/hello.txt holds exactly "Hello, world!\n", else 0.
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "Hello, world!" ] && [ "$(wc -l < /app/hello.txt)" -eq 1 ]; then
  echo "hello.txt is right"
  echo 1 > /logs/verifier/reward.txt
else
  echo "hello.txt is missing or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
