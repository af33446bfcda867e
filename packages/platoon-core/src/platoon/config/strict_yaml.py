"""The YAML loader every config file is read with: a safe loader that refuses a key given twice (the config loader
and the site profile both read with it)."""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives a key twice: YAML would silently keep the last value."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key
        self.line = line
        self.first_line = first_line


class StrictSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a mapping giving a key twice (merge keys `<<` may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                given = key in first_lines
            except TypeError:  # an unhashable key: the base class says what is wrong with it
                continue
            if given:
                raise DuplicateKey(key, line, first_lines[key])
            first_lines[key] = line
        return super().construct_mapping(node, deep=deep)
