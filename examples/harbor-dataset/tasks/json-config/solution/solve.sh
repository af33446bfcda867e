#!/bin/bash
printf '{"name": "platoon", "port": %d}\n' "$SERVICE_PORT" > /app/config.json
