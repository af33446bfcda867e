#!/bin/bash
cat > /app/top_words.py <<'PY'
import collections
import re
import sys

words = re.findall(r"[a-z]+", open(sys.argv[1], encoding="utf-8").read().lower())
for word, count in sorted(collections.Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
    print(word, count)
PY
