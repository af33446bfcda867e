"""`platoon harbor ...`: fetch, verify and index datasets (dataset_cli); task images are not available yet."""

from __future__ import annotations

from platoon.cli.output import new_app
from platoon.cli.pending import not_available
from platoon_harbor import dataset_cli

app = new_app("Harbor datasets: fetch and lock, verify, task images.")
images = new_app("Task images: plan, build, verify, alias.")
app.add_typer(images, name="images")


# Datasets: fetch and lock, verify, index (platoon_harbor.dataset_cli; heavy imports stay inside the commands).
app.command("fetch")(dataset_cli.fetch)
app.command("verify")(dataset_cli.verify)
app.command("index")(dataset_cli.index)


for _step in ("plan", "build", "verify", "alias"):

    def _image_step(step: str = _step) -> int:
        return not_available(f"harbor images {step}", "Harbor task images")

    images.command(
        _step,
        help=f"Task images: {_step}.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(_image_step)
