#!/bin/bash
# 1 when /app/config.json is an object with name "platoon" and the expected port, else 0.
if python3 - <<'PY'
import json, os, sys
try:
    data = json.load(open("/app/config.json"))
except Exception as exc:
    sys.exit(f"config.json unreadable: {exc}")
ok = isinstance(data, dict) and data.get("name") == "platoon" and data.get("port") == int(os.environ["EXPECTED_PORT"])
sys.exit(0 if ok else f"wrong config: {data}")
PY
then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
