"""The trajectory viewer (`platoon viz tail|replay|show-dump`).

`platoon.viz.model` and `platoon.viz.sources` read event files into a tree without Textual; `platoon.viz.app` is the
Textual app and `platoon.viz.cli` its command line, which imports Textual only when a command runs. Also runnable
as `python -m platoon.viz`.
"""
