"""Reading a user's YAML file safely, and quoting a user's values in messages.

`read_yaml` refuses aliases (a 352-byte file of nested aliases expands to gigabytes) and duplicate keys (YAML
would keep the last one silently); every problem is one `UserError` line with the file and the position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tune_as.errors import UserError, first_line

EXCERPT = 80  # characters of a user's value quoted in a message (a value can be megabytes long)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def show(value: Any) -> str:
    """A user's value for a message: its repr, cut to a bounded excerpt."""
    return clip(repr(value), EXCERPT)


class StrictLoader(yaml.SafeLoader):
    """A SafeLoader without aliases and without duplicate keys."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"expected no aliases (write each value out), got "
                                              f"*{clip(str(event.anchor), EXCERPT)}", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"expected each key once, got {show(key_node.value)} twice",
                        key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, what: str) -> Any:
    """The parsed document of `path` (None for an empty file); `what` names the file in messages."""
    if not path.exists():
        raise UserError(f"{what} file not found: expected {path} to exist")
    if not path.is_file():  # a folder, /dev/zero, a FIFO: reading it would fail or never end
        raise UserError(f"{what}: expected a YAML file, got {path}, which is not a regular file")
    try:
        return yaml.load(path.read_bytes(), Loader=StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise UserError(
            f"{path}: invalid YAML at {at}: {clip(str(getattr(exc, 'problem', None) or exc), 300)}"
        ) from None
    except RecursionError:
        raise UserError(f"{path}: invalid YAML: expected a few levels of nesting, got too many") from None
    except OSError as exc:
        raise UserError(f"{path}: expected a readable file, got {first_line(exc)}") from None
