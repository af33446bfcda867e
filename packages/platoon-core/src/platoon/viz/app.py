"""The trajectory viewer's Textual app: the rollouts grouped by training step on the left, the highlighted node's
details on the right (a draggable divider between them), a filter bar, a search bar with grouped results, a help
screen, and the keys docs/viewer.md lists.

Imported only when a viewer command runs (`platoon.viz.cli` imports it once the arguments are good). What is shown
comes from `platoon.viz.model`; this module keeps the Tree widget in step with the model's nodes by their stable keys
(so what the user opened and the cursor survive updates), and fills a node's children into the widget only once it
is opened: a run of thousands of rollouts costs a few dozen widget nodes until the user looks inside. At rest it is
idle: a followed file that stops growing is looked at less and less often (`sources.Backoff`), and a replay that
reached its end stops its timer.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.json import JSON
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Footer, Input, Static, Tree
from textual.widgets.tree import TreeNode

from platoon.viz.model import (
    FILTER_TERMS,
    EventModel,
    Mode,
    Node,
    RolloutFilter,
    SearchGroup,
    Section,
    collection_node,
    fit,
    parse_filter,
    search,
    view,
)
from platoon.viz.sources import Backoff, Replay, Tailer

__all__ = ["HELP", "ViewerApp", "render_sections"]

Kind = Literal["tail", "replay"]
T = TypeVar("T")

#: the actions of printable keys (and `right`), which a focused text field must receive as text instead
_TYPING_ACTIONS = frozenset(
    {"quit", "toggle_play", "step", "restart", "toggle_mouse", "details_only", "filter", "help"}
)
#: labels narrower than this are left whole (the pane is being dragged shut)
_NARROWEST_CUT = 12
#: the open/close arrow: bold, and marked as Tree marks it so that a click on it opens or closes the node
_TOGGLE = Style(bold=True) + Style.from_meta({"toggle": True})

HELP = f"""\
[b]platoon viz[/b]: the rollouts of a run, grouped by training step (or evaluation), newest first.

[b]Moving around[/b]
up / down          move; the details pane shows the highlighted node
enter              open or close the highlighted node
shift+up / down    previous / next sibling;  shift+left: the parent
d                  details only (cleaner terminal selection); d again: both panes
m                  mouse capture on/off (off: drag in the terminal to select text)
drag the bar       resize the panes

[b]Following and replaying[/b]
space              play / pause (replay); pause / resume following (tail)
right, n           one record (replay) or one look at the files (tail); pauses
r                  restart from the beginning

[b]Filter (f)[/b]: which rollouts are listed; every term must hold; enter applies it, an empty filter lists all
{FILTER_TERMS}
e.g.  reward<1 outcome:error,timeout task:train:3 label:math step:10..12

[b]Search (ctrl+f)[/b]: matches in labels and details, grouped by trajectory; enter jumps to the first
f3 / shift+f3      next / previous result
escape             close the search or the filter

? or escape closes this help;  q quits the viewer."""


def render_sections(sections: Sequence[Section], title: str | None = None) -> RenderableType:
    """The details pane's content: the node's whole label (the tree may have cut it), then a bold title per section,
    code highlighted, JSON pretty-printed."""
    parts: list[RenderableType] = []
    if title:
        parts += [Text(title, style="bold"), Text("")]
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


class FittedTree(Tree[T]):
    """A Tree whose labels are cut to the pane's width at a word boundary, an ellipsis marking the cut, instead of
    running off the edge mid-word (the details pane shows the whole label), and whose `enter` opens a node at once:
    `opening` fills its children first, so a key pressed right after lands among them."""

    #: called with a node about to be opened by `enter`, to give it its children
    opening: Callable[[TreeNode[T]], None] | None = None

    def action_select_cursor(self) -> None:
        # Tree's own `enter` opens the node later, on a message of its own, and a `down` typed before that message
        # would skip what was being opened; here it is open before the next key is read.
        node = self.cursor_node
        if node is not None and node.allow_expand:
            if node.is_expanded:
                node.collapse()
            else:
                if self.opening is not None:
                    self.opening(node)
                node.expand()
        super().action_select_cursor()

    def render_label(self, node: TreeNode[T], base_style: Style, style: Style) -> Text:
        label = Text(node.label) if isinstance(node.label, str) else node.label.copy()
        depth = 0
        parent = node.parent
        while parent is not None and not (parent.is_root and not self.show_root):
            depth += 1
            parent = parent.parent
        prefix = self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE
        room = self.scrollable_content_region.width - depth * self.guide_depth
        room -= cell_len(prefix) if node.allow_expand else 0
        if room >= _NARROWEST_CUT and label.cell_len > room:
            label = Text(fit(label.plain, room), style=label.style)
            label.truncate(room)  # wide characters take two cells
        label.stylize(style)
        if not node.allow_expand:
            return label
        return Text.assemble((prefix, base_style + _TOGGLE), label)


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


class HelpScreen(ModalScreen[None]):
    """The keys and the filter's terms (`?`)."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 112; max-width: 100%; height: auto; max-height: 90%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    HelpScreen Static { width: 100%; height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark", "close", "Close help", priority=True)
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP, id="help-text")

    def action_close(self) -> None:
        self.dismiss()


class ViewerApp(App[int]):
    """The viewer over a `Tailer` (follow files) or a `Replay` (read whole, step through by time)."""

    TITLE = "platoon viz"
    CSS = """
    #left { width: 55%; }
    #search, #filter { height: auto; max-height: 50%; display: none; }
    #search.open, #filter.open { display: block; }
    #results { height: auto; max-height: 12; border-bottom: solid $panel-lighten-2; }
    #filter-error { color: $error; height: auto; }
    #tree { height: 1fr; }
    #details-pane { width: 1fr; padding: 0 1; }
    #status { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    Screen.details-only #left { display: none; }
    Screen.details-only Divider { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", priority=True),
        Binding("space", "toggle_play", "Play/pause", priority=True),
        Binding("right,n", "step", "Step", priority=True, key_display="n"),
        Binding("r", "restart", "Restart", priority=True),
        Binding("f", "filter", "Filter", priority=True),
        Binding("ctrl+f", "search", "Search", priority=True),
        Binding("f3", "next_hit", "Next", priority=True, show=False),
        Binding("shift+f3", "previous_hit", "Previous", priority=True, show=False),
        Binding("escape", "close_bars", "Close", priority=True, show=False),
        Binding("m", "toggle_mouse", "Mouse", priority=True),
        Binding("d", "details_only", "Details only", priority=True),
        Binding("question_mark", "help", "Help", priority=True, key_display="?"),
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
        rule: RolloutFilter | None = None,
    ) -> None:
        super().__init__()
        if (tailer is None) == (replay is None):
            raise ValueError("ViewerApp takes a tailer or a replay")
        self.tailer, self.replay = tailer, replay
        self.kind: Kind = "tail" if tailer is not None else "replay"
        self.delay = max(0.0, delay)
        self.mode: Mode = mode
        self.model = EventModel()
        self.rule = rule or RolloutFilter()
        self.playing = True
        self.mouse_reporting = not selectable_text
        self.backoff = Backoff()
        self.poll_timer: Timer | None = None  # the next look at the followed files
        self.timer: Timer | None = None  # the replay's next record; None once it reached the end
        self.nodes: dict[str, Node] = {}  # collection id -> its node tree, as last built
        self.top: list[Node] = []  # the tree's top level as last shown (groups, and rollouts in none)
        self.tree_nodes: dict[str, TreeNode[Node]] = {}  # node key -> its widget node, where one was made
        self.groups: list[SearchGroup] = []
        self.hits: list[str] = []
        self.hit_index = -1
        self._status_shown = ""
        if title:
            self.sub_title = title

    # -- layout --------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="left"):
                with Vertical(id="filter"):
                    yield Input(placeholder=f"filter: {FILTER_TERMS}", id="filter-input")
                    yield Static(id="filter-error")
                with Vertical(id="search"):
                    yield Input(
                        placeholder="search (enter: first hit, f3/shift+f3: next/previous)", id="search-input"
                    )
                    results: FittedTree[str] = FittedTree("results", id="results")
                    results.show_root = False
                    results.auto_expand = False
                    yield results
                tree: FittedTree[Node] = FittedTree("rollouts", id="tree")
                tree.show_root = False
                tree.auto_expand = False  # `enter` opens a node itself (FittedTree); a click only selects it
                tree.opening = self._fill
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
            self.poll()
        else:
            assert self.replay is not None
            if self.delay == 0:
                self._apply(self.replay.take(None))
            else:
                self.timer = self.set_interval(self.delay, self._tick)
        self._status()

    # -- feeding the model ---------------------------------------------------------------------------------

    def poll(self) -> None:
        """One look at the followed files, then the next one scheduled: soon while they grow, later and later
        (up to `sources.POLL_LONGEST`) while they do not."""
        self.poll_timer = None
        if not self.playing or not self.is_running:
            return
        changed = self._poll_once()
        self.schedule_poll(self.backoff.after(changed))

    def schedule_poll(self, delay: float) -> None:
        """The next look at the files in `delay` seconds (tests replace this to run the app on simulated time)."""
        self.poll_timer = self.set_timer(delay, self.poll)

    def _poll_once(self) -> bool:
        """Read what the files gained; whether anything did."""
        assert self.tailer is not None
        changed: set[str] = set()
        for path, records, reset in self.tailer.poll():
            if reset:
                changed |= self.model.forget_source(str(path))
            changed |= self.model.apply_all(records, str(path))
        if changed:
            self._refresh_collections(changed)
        self._status()
        return bool(changed)

    def _tick(self) -> None:
        # Textual takes the screens down before it stops the app's timers: a tick landing in between (a user quitting
        # mid-replay) would find no tree to fill.
        if not self.is_running:
            return
        if self.playing and self.replay is not None and not self.replay.done:
            self._apply(self.replay.take(1))
        if self.replay is not None and self.replay.done:
            self._stop_replay_timer()

    def _stop_replay_timer(self) -> None:
        # At its end a replay has nothing to do: no timer stays behind waking the app.
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
        self._status()

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
        for cid in changed:
            collection = self.model.collections.get(cid)
            if collection is None:
                self.nodes.pop(cid, None)
            else:
                self.nodes[cid] = collection_node(collection, self.mode)
        self._refresh_view()

    def _refresh_view(self) -> None:
        """Show the model's rollouts as the filter lets them through, keeping what is open and the cursor."""
        tree = self.query_one("#tree", Tree)
        self.top = view(self.model.collections.values(), self.nodes, self.rule)
        self._sync(tree.root, self.top)
        self._show_cursor()
        if self.query_one("#search").has_class("open"):
            self._run_search(self.query_one("#search-input", Input).value, keep_position=True)

    def _sync(self, parent: TreeNode[Node], wanted: list[Node]) -> None:
        """Make `parent`'s children show `wanted` (reusing widget nodes with the same key; a new one goes where
        `wanted` puts it), and go on into the children that are open; a closed one is filled when it is opened
        (`_fill`)."""
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
            if widget.is_expanded:
                self._sync(widget, node.children)
            previous = widget

    def _forget(self, widget: TreeNode[Node]) -> None:
        if widget.data is not None:
            self.tree_nodes.pop(widget.data.key, None)
        for child in widget.children:
            self._forget(child)

    @on(Tree.NodeExpanded, "#tree")
    def _opened(self, event: Tree.NodeExpanded[Node]) -> None:
        self._fill(event.node)

    def _fill(self, widget: TreeNode[Node]) -> None:
        """Give a node that is being opened its children (a closed node's are made only when it opens)."""
        if widget.data is not None:
            self._sync(widget, widget.data.children)

    def _clear(self) -> None:
        self.model.reset()
        self.nodes.clear()
        self.top = []
        self.tree_nodes.clear()
        self.query_one("#tree", Tree).root.remove_children()
        self.query_one("#details", Static).update(Text("select a node to see its details", style="dim"))

    # -- details and status --------------------------------------------------------------------------------

    @on(Tree.NodeHighlighted, "#tree")
    def _highlighted(self, event: Tree.NodeHighlighted[Node]) -> None:
        if event.node.data is not None:
            self._show(event.node.data)

    def _show_cursor(self) -> None:
        """The details of the node under the cursor; the cursor goes to the first line when it is on none, so the
        details pane is never blank while the tree has something to show."""
        tree = self.query_one("#tree", Tree)
        if tree.cursor_node is None and tree.root.children:
            tree.move_cursor(tree.root.children[0])
        cursor = tree.cursor_node
        if cursor is not None and cursor.data is not None:
            self._show(cursor.data)

    def _show(self, node: Node) -> None:
        self.query_one("#details", Static).update(render_sections(node.details, title=node.label))

    def shown_rollouts(self) -> list[Node]:
        """The collection nodes the filter lets through, in tree order."""
        return [node for top in self.top for node in (top.children if top.kind == "group" else [top])]

    def status_text(self) -> str:
        total = len(self.model.collections)
        parts = [self.kind, f"mode {self.mode}"]
        if self.rule:
            parts.append(f"filter {self.rule.text}: {len(self.shown_rollouts())} of {total} rollouts")
        else:
            parts.append(f"{total} rollout{'s' if total != 1 else ''}")
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
        parts.append("? help")
        return " · ".join(parts)

    def _status(self) -> None:
        text = self.status_text()
        if text != self._status_shown:  # an unchanged line is not drawn again
            self._status_shown = text
            self.query_one("#status", Static).update(text)

    # -- actions -------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if isinstance(self.screen, HelpScreen):
            return action == "quit"  # the help's own keys close it
        # Typing into a text field: its letters, space and arrows are text, not commands.
        return not (action in _TYPING_ACTIONS and isinstance(self.focused, Input))

    def action_toggle_play(self) -> None:
        self.playing = not self.playing
        if self.tailer is not None:
            if self.playing:
                self.backoff.reset()
                self.poll()
            elif self.poll_timer is not None:
                self.poll_timer.stop()
                self.poll_timer = None
        elif self.timer is not None:
            if self.playing:
                self.timer.resume()
            else:
                self.timer.pause()
        self._status()

    def action_step(self) -> None:
        """One record (replay) or one look at the files (tail); playback pauses."""
        if self.playing and (self.tailer is not None or self.timer is not None):
            self.action_toggle_play()
        if self.replay is not None:
            self._apply(self.replay.take(1))
            if self.replay.done:
                self._stop_replay_timer()
        else:
            self._poll_once()

    def action_restart(self) -> None:
        self._clear()
        if self.replay is not None:
            self.replay.restart()
            if self.delay == 0:
                self._apply(self.replay.take(None))
            elif self.timer is None:
                self.timer = self.set_interval(self.delay, self._tick, pause=not self.playing)
        else:
            assert self.tailer is not None
            self.tailer.restart()
            self._poll_once()
            self.backoff.reset()
        self._status()

    def action_filter(self) -> None:
        self._close_bar("#search")
        bar = self.query_one("#filter")
        bar.add_class("open")
        field = self.query_one("#filter-input", Input)
        field.value = self.rule.text
        self.query_one("#filter-error", Static).update("")
        field.focus()

    @on(Input.Submitted, "#filter-input")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            self.rule = parse_filter(event.value)
        except ValueError as exc:
            self.query_one("#filter-error", Static).update(str(exc))
            return
        self._close_bar("#filter")
        self._refresh_view()
        self._status()

    def action_search(self) -> None:
        self._close_bar("#filter")
        self.query_one("#search").add_class("open")
        self.query_one("#search-input", Input).focus()

    def action_close_bars(self) -> None:
        self._close_bar("#search")
        self._close_bar("#filter")

    def _close_bar(self, which: str) -> None:
        bar = self.query_one(which)
        if bar.has_class("open"):
            bar.remove_class("open")
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

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

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
        self.groups = search(self.shown_rollouts(), query)
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

    def _path_to(self, key: str) -> list[Node]:
        """The nodes from the top of the tree down to the one with `key` ([] when it is not shown)."""
        rollout = key.split("/", 1)[0]

        def down(node: Node) -> list[Node]:
            if node.key == key:
                return [node]
            for child in node.children:
                found = down(child)
                if found:
                    return [node, *found]
            return []

        for top in self.top:
            if top.key == key:
                return [top]
            for node in top.children if top.kind == "group" else [top]:
                if node.key == rollout:
                    found = down(node)
                    return [top, *found] if found and top is not node else found
        return []

    def _jump(self, key: str) -> None:
        """Open the way to the node with `key`, move the cursor there and show its details."""
        path = self._path_to(key)
        if not path:
            return
        tree = self.query_one("#tree", Tree)
        for node in path[:-1]:
            widget = self.tree_nodes.get(node.key)
            if widget is None:
                return
            if not widget.is_expanded:
                widget.expand()
                self._sync(widget, node.children)
        widget = self.tree_nodes.get(key)
        if widget is None:
            return
        tree.last_line  # noqa: B018 -- rebuilds the tree's lines after the expansions, so the node has its line
        tree.move_cursor(widget)
        self._show(path[-1])

    # -- what tests and the screenshot script ask ----------------------------------------------------------

    def labels(self) -> list[str]:
        """Every label the tree widget holds, depth-first (closed nodes' children only once they were opened)."""
        return [str(widget.label) for widget, _ in self._widgets(open_only=False)]

    def shown_labels(self) -> list[str]:
        """The labels on the tree's lines, top to bottom: what a user sees scrolling through it."""
        return [str(widget.label) for widget, _ in self._widgets(open_only=True)]

    def _widgets(self, *, open_only: bool) -> list[tuple[TreeNode[Node], int]]:
        found: list[tuple[TreeNode[Node], int]] = []

        def walk(node: TreeNode[Node], depth: int) -> None:
            for child in node.children:
                found.append((child, depth))
                if child.is_expanded or not open_only:
                    walk(child, depth + 1)

        walk(self.query_one("#tree", Tree).root, 0)
        return found

    def select(self, key: str) -> None:
        """Move the cursor to the node with `key` (its ancestors opened) and show its details."""
        self._jump(key)

    def details_text(self) -> str:
        """What the details pane shows, as plain text."""
        console = Console(width=1000, record=True, file=io.StringIO(), color_system=None)
        console.print(self.query_one("#details", Static).content)
        return console.export_text()
