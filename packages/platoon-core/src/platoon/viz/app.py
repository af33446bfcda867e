"""The trajectory viewer's Textual app: the agent tree on the left, the selected node's details on the right
(a draggable divider between them), a search bar with grouped results, and the keys of harness.md section 8.

Imported only when a viewer command runs (`platoon.viz.cli` imports it inside `main`). What is shown comes from
`platoon.viz.model`; this module only keeps the Tree widget in step with the model's nodes (by their stable keys,
so expanded nodes and the cursor survive updates) and renders `Section`s with rich.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.syntax import Syntax
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Footer, Input, Static, Tree
from textual.widgets.tree import TreeNode

from platoon.viz.model import EventModel, Mode, Node, SearchGroup, Section, collection_node, search
from platoon.viz.sources import POLL_INTERVAL, Replay, Tailer

__all__ = ["ViewerApp", "render_sections"]

Kind = Literal["tail", "replay"]

#: the actions of printable keys (and `right`), which a focused search field must receive as text instead
_TYPING_ACTIONS = frozenset({"quit", "toggle_play", "step", "restart", "toggle_mouse", "details_only"})


def render_sections(sections: Sequence[Section]) -> RenderableType:
    """The details pane's content: a bold title per section, code highlighted, JSON pretty-printed."""
    parts: list[RenderableType] = []
    for section in sections:
        parts.append(Text(section.title, style="bold underline"))
        if section.kind == "code":
            parts.append(
                Syntax(str(section.content), section.language, word_wrap=True, background_color="default")
            )
        elif section.kind == "json":
            parts.append(JSON.from_data(section.content, default=str))
        else:
            parts.append(Text(str(section.content)))
        parts.append(Text(""))
    return Group(*parts) if parts else Text("(nothing to show)", style="dim")


class Divider(Widget):
    """The bar between the panes; dragging it sets the tree pane's width."""

    DEFAULT_CSS = """
    Divider { width: 1; height: 100%; background: $panel-lighten-1; }
    Divider:hover { background: $accent; }
    """

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.dragging = False

    def render(self) -> RenderableType:
        return ""

    def on_mouse_down(self, event: events.MouseDown) -> None:
        self.dragging = True
        self.capture_mouse()
        event.stop()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        if self.dragging:
            width = max(10, min(event.screen_x, self.screen.size.width - 10))
            self.app.query_one(self.target).styles.width = width
            event.stop()

    def on_mouse_up(self, event: events.MouseUp) -> None:
        if self.dragging:
            self.dragging = False
            self.release_mouse()
            event.stop()


class ViewerApp(App[int]):
    """The viewer over a `Tailer` (follow files) or a `Replay` (read whole, step through by time)."""

    TITLE = "platoon viz"
    CSS = """
    #left { width: 55%; }
    #search { height: auto; max-height: 50%; display: none; }
    #search.open { display: block; }
    #results { height: auto; max-height: 12; border-bottom: solid $panel-lighten-2; }
    #tree { height: 1fr; }
    #details-pane { width: 1fr; padding: 0 1; }
    #status { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    Screen.details-only #left { display: none; }
    Screen.details-only Divider { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", priority=True),
        Binding("space", "toggle_play", "Play/pause", priority=True),
        Binding("right,n", "step", "Step", priority=True),
        Binding("r", "restart", "Restart", priority=True),
        Binding("ctrl+f", "search", "Search", priority=True),
        Binding("f3", "next_hit", "Next", priority=True),
        Binding("shift+f3", "previous_hit", "Previous", priority=True),
        Binding("escape", "close_search", "Close search", priority=True, show=False),
        Binding("m", "toggle_mouse", "Mouse", priority=True),
        Binding("d", "details_only", "Details only", priority=True),
    ]

    def __init__(
        self,
        *,
        tailer: Tailer | None = None,
        replay: Replay | None = None,
        delay: float = 0.5,
        mode: Mode = "auto",
        selectable_text: bool = False,
        title: str | None = None,
    ) -> None:
        super().__init__()
        if (tailer is None) == (replay is None):
            raise ValueError("ViewerApp takes a tailer or a replay")
        self.tailer, self.replay = tailer, replay
        self.kind: Kind = "tail" if tailer is not None else "replay"
        self.delay = max(0.0, delay)
        self.mode: Mode = mode
        self.model = EventModel()
        self.playing = True
        self.mouse_reporting = not selectable_text
        self.nodes: dict[str, Node] = {}  # collection id -> its node tree, as last built
        self.tree_nodes: dict[str, TreeNode[Node]] = {}  # node key -> its widget node
        self.groups: list[SearchGroup] = []
        self.hits: list[str] = []
        self.hit_index = -1
        if title:
            self.sub_title = title

    # -- layout --------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="left"):
                with Vertical(id="search"):
                    yield Input(
                        placeholder="search (enter: first hit, f3/shift+f3: next/previous)", id="search-input"
                    )
                    results: Tree[str] = Tree("results", id="results")
                    results.show_root = False
                    yield results
                tree: Tree[Node] = Tree("events", id="tree")
                tree.show_root = False
                yield tree
            yield Divider("#left")
            with VerticalScroll(id="details-pane"):
                yield Static(Text("select a node to see its details", style="dim"), id="details")
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#tree", Tree).focus()
        if not self.mouse_reporting:
            self._set_mouse(False)
        if self.tailer is not None:
            self._poll()
            self.timer = self.set_interval(POLL_INTERVAL, self._poll)
        else:
            assert self.replay is not None
            if self.delay == 0:
                self._apply(self.replay.take(None))
            self.timer = self.set_interval(self.delay or POLL_INTERVAL, self._tick, pause=self.delay == 0)
        self._status()

    # -- feeding the model ---------------------------------------------------------------------------------

    def _poll(self) -> None:
        assert self.tailer is not None
        if not self.playing:
            return
        self._poll_once()

    def _poll_once(self) -> None:
        assert self.tailer is not None
        changed: set[str] = set()
        for path, records, reset in self.tailer.poll():
            if reset:
                changed |= self.model.forget_source(str(path))
            changed |= self.model.apply_all(records, str(path))
        if changed:
            self._refresh_collections(changed)
        self._status()

    def _tick(self) -> None:
        if self.playing and self.replay is not None and not self.replay.done:
            self._apply(self.replay.take(1))

    def _apply(self, items: Sequence[tuple[Path, dict[str, Any]]]) -> None:
        changed: set[str] = set()
        for path, record in items:
            cid = self.model.apply(record, str(path))
            if cid is not None:
                changed.add(cid)
        if changed:
            self._refresh_collections(changed)
        self._status()

    def _refresh_collections(self, changed: set[str]) -> None:
        tree = self.query_one("#tree", Tree)
        for cid in changed:
            collection = self.model.collections.get(cid)
            if collection is None:
                self.nodes.pop(cid, None)
            else:
                self.nodes[cid] = collection_node(collection, self.mode)
        self._sync(tree.root, [self.nodes[cid] for cid in self.model.collections if cid in self.nodes])
        cursor = tree.cursor_node
        if cursor is not None and cursor.data is not None:
            self._show(cursor.data)
        if self.query_one("#search").has_class("open"):
            self._run_search(self.query_one("#search-input", Input).value, keep_position=True)

    def _sync(self, parent: TreeNode[Node], wanted: list[Node]) -> None:
        """Make `parent`'s children show `wanted`, reusing widget nodes with the same key."""
        keys = {node.key for node in wanted}
        existing: dict[str, TreeNode[Node]] = {}
        for child in list(parent.children):
            if child.data is not None and child.data.key in keys:
                existing[child.data.key] = child
            else:
                self._forget(child)
                child.remove()
        previous: TreeNode[Node] | None = None
        for node in wanted:
            label = Text(node.label, style=node.style or "")
            widget = existing.get(node.key)
            if widget is None:
                if previous is not None:
                    widget = parent.add(label, node, after=previous, expand=node.expand)
                elif parent.children:
                    widget = parent.add(label, node, before=0, expand=node.expand)
                else:
                    widget = parent.add(label, node, expand=node.expand)
                self.tree_nodes[node.key] = widget
            else:
                if widget.data is None or widget.data.label != node.label or widget.data.style != node.style:
                    widget.set_label(label)
                widget.data = node
            widget.allow_expand = bool(node.children)
            self._sync(widget, node.children)
            previous = widget

    def _forget(self, widget: TreeNode[Node]) -> None:
        if widget.data is not None:
            self.tree_nodes.pop(widget.data.key, None)
        for child in widget.children:
            self._forget(child)

    def _clear(self) -> None:
        self.model.reset()
        self.nodes.clear()
        self.tree_nodes.clear()
        self.query_one("#tree", Tree).root.remove_children()
        self.query_one("#details", Static).update(Text("select a node to see its details", style="dim"))

    # -- details and status --------------------------------------------------------------------------------

    @on(Tree.NodeHighlighted, "#tree")
    def _highlighted(self, event: Tree.NodeHighlighted[Node]) -> None:
        if event.node.data is not None:
            self._show(event.node.data)

    def _show(self, node: Node) -> None:
        self.query_one("#details", Static).update(render_sections(node.details))

    def status_text(self) -> str:
        parts = [self.kind, f"mode {self.mode}", f"{len(self.model.collections)} collection(s)"]
        if self.tailer is not None:
            parts += [f"{len(self.tailer.tails)} file(s)", "following" if self.playing else "paused"]
        elif self.replay is not None:
            parts.append(f"record {self.replay.position}/{len(self.replay.records)}")
            parts.append(
                "done" if self.replay.done else "playing" if self.playing and self.delay else "paused"
            )
        if not self.mouse_reporting:
            parts.append("mouse off (terminal selection)")
        if self.hits:
            parts.append(f"hit {self.hit_index + 1}/{len(self.hits)}")
        return " · ".join(parts)

    def _status(self) -> None:
        self.query_one("#status", Static).update(self.status_text())

    # -- actions -------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Typing into the search field: its letters, space and arrows are text, not commands.
        return not (action in _TYPING_ACTIONS and isinstance(self.focused, Input))

    def action_toggle_play(self) -> None:
        self.playing = not self.playing
        if self.replay is not None and self.delay:
            if self.playing:
                self.timer.resume()
            else:
                self.timer.pause()
        self._status()

    def action_step(self) -> None:
        """One record (replay) or one look at the files (tail); playback pauses."""
        if self.playing and (self.tailer is not None or self.delay):
            self.action_toggle_play()
        if self.replay is not None:
            self._apply(self.replay.take(1))
        else:
            self._poll_once()

    def action_restart(self) -> None:
        self._clear()
        if self.replay is not None:
            self.replay.restart()
            if self.delay == 0:
                self._apply(self.replay.take(None))
        else:
            assert self.tailer is not None
            self.tailer.restart()
            self._poll_once()
        self._status()

    def action_search(self) -> None:
        self.query_one("#search").add_class("open")
        self.query_one("#search-input", Input).focus()

    def action_close_search(self) -> None:
        search_bar = self.query_one("#search")
        if search_bar.has_class("open"):
            search_bar.remove_class("open")
            self.query_one("#tree", Tree).focus()

    def action_next_hit(self) -> None:
        self._move_hit(1)

    def action_previous_hit(self) -> None:
        self._move_hit(-1)

    def action_toggle_mouse(self) -> None:
        self._set_mouse(not self.mouse_reporting)
        self.notify("mouse capture " + ("on" if self.mouse_reporting else "off: drag to select text"))

    def action_details_only(self) -> None:
        self.screen.toggle_class("details-only")
        if self.screen.has_class("details-only"):
            self.query_one("#details-pane").focus()
        else:
            self.query_one("#tree", Tree).focus()

    def _set_mouse(self, captured: bool) -> None:
        """Mouse reporting on or off in the terminal; off lets the terminal's own drag-selection work."""
        self.mouse_reporting = captured
        driver = getattr(self, "_driver", None)
        switch = getattr(driver, "_enable_mouse_support" if captured else "_disable_mouse_support", None)
        if callable(switch):  # the terminal drivers have it; the headless one (tests) has no terminal
            switch()
        self._status()

    # -- search --------------------------------------------------------------------------------------------

    @on(Input.Changed, "#search-input")
    def _query_changed(self, event: Input.Changed) -> None:
        self._run_search(event.value)

    @on(Input.Submitted, "#search-input")
    def _query_submitted(self, event: Input.Submitted) -> None:
        self._run_search(event.value)
        if self.hits:
            self.hit_index = -1
            self._move_hit(1)
            self.query_one("#tree", Tree).focus()

    @on(Tree.NodeSelected, "#results")
    def _result_chosen(self, event: Tree.NodeSelected[str]) -> None:
        key = event.node.data
        if key in self.hits:
            self.hit_index = self.hits.index(key)
            self._jump(key)
            self._status()

    def _run_search(self, query: str, *, keep_position: bool = False) -> None:
        current = (
            self.hits[self.hit_index] if keep_position and 0 <= self.hit_index < len(self.hits) else None
        )
        self.groups = search(self.nodes.values(), query)
        self.hits = [hit.key for group in self.groups for hit in group.hits]
        self.hit_index = self.hits.index(current) if current in self.hits else -1
        results = self.query_one("#results", Tree)
        results.root.remove_children()
        for group in self.groups:
            branch = results.root.add(
                Text(f"{group.label} ({len(group.hits)})", style="bold"), None, expand=True
            )
            for hit in group.hits:
                branch.add_leaf(Text(hit.label, style=hit.style or ""), hit.key)
        self._status()

    def _move_hit(self, direction: int) -> None:
        if not self.hits:
            self.bell()
            return
        self.hit_index = (self.hit_index + direction) % len(self.hits)
        self._jump(self.hits[self.hit_index])
        self._status()

    def _jump(self, key: str) -> None:
        widget = self.tree_nodes.get(key)
        if widget is None:
            return
        ancestor = widget.parent
        while ancestor is not None:
            ancestor.expand()
            ancestor = ancestor.parent
        tree = self.query_one("#tree", Tree)
        tree.last_line  # noqa: B018 -- rebuilds the tree's lines after the expansions, so the node has its line
        tree.move_cursor(widget)
        if widget.data is not None:
            self._show(widget.data)

    # -- what tests and the screenshot script ask ----------------------------------------------------------

    def labels(self) -> list[str]:
        """Every label in the tree widget, depth-first (collapsed branches included)."""
        found: list[str] = []

        def walk(node: TreeNode[Node]) -> None:
            for child in node.children:
                found.append(str(child.label))
                walk(child)

        walk(self.query_one("#tree", Tree).root)
        return found

    def select(self, key: str) -> None:
        """Move the cursor to the node with `key` (its ancestors expanded) and show its details."""
        self._jump(key)
