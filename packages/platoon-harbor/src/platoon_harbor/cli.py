"""`platoon harbor ...`: fetch, verify and index datasets (dataset_cli); check them (check_cli); task images
(images_cli)."""

from __future__ import annotations

from platoon.console import new_app
from platoon_harbor import check_cli, dataset_cli, images_cli

app = new_app("Harbor datasets: fetch and lock, verify, check, task images.")
images = new_app("Task images: plan, build, verify, alias.")
app.add_typer(images, name="images")


# Datasets: fetch and lock, verify, index (platoon_harbor.dataset_cli; heavy imports stay inside the commands).
app.command("fetch")(dataset_cli.fetch)
app.command("verify")(dataset_cli.verify)
app.command("index")(dataset_cli.index)

# The dataset check: oracle and noop on every task, unsound tasks quarantined (platoon_harbor.check_cli).
app.command("check")(check_cli.check)


# Task images: plan, build, verify, alias (platoon_harbor.images_cli).
images_cli.register(images)
