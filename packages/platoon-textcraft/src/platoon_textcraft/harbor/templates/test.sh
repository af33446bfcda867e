#!/bin/bash
# Grades the episode by replaying its action log with the verifier's own copies of the game, recipes and task
# (never the ones the agent could reach). The verifier writes reward.json and textcraft-verdict.json.
set -u
root="${PLATOON_SANDBOX_ROOT:-}"
out="$root/logs/verifier"
mkdir -p "$out"
rm -f "$out/reward.json" "$out/reward.txt" "$out/textcraft-verdict.json"
exec python3 -I "$root/tests/textcraft_game.py" verify \
  --task "$root/tests/task.json" \
  --recipes "$root/tests/recipes.json" \
  --root "$root/" \
  --log app/textcraft/actions.jsonl \
  --out "$out"
