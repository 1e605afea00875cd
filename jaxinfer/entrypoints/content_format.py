"""How a chat template reads a message's content (vLLM's `chat_template_content_format`).

"string": the template prints `message['content']`, so content goes to it as text (image parts as their mark text).
"openai": the template loops over `message['content']`'s typed parts (llava-hf's LLaVA-NeXT / OneVision templates:
`{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>\n...`), so content goes as a
list of parts ({"type": "text", "text": ...}, {"type": "image"}) and the template writes each image's mark; as text
it would find no parts and drop the user's words and images. "auto" tells the two apart from the template's Jinja
syntax tree, as vLLM's `_detect_content_format` does. No jax and no server extra.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import jinja2
import jinja2.nodes as nodes

CONTENT_FORMATS = ("auto", "string", "openai")


def check_content_format(value: Any) -> str:
    """chat_template_content_format checked by name: one of CONTENT_FORMATS."""
    if value not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format {value!r} is not supported; accepted: "
                         f"{', '.join(CONTENT_FORMATS)}")
    return value


def resolve_content_format(value: Any, template: Any) -> str:
    """"string" or "openai": the given format, or with "auto" the template's own (detect_content_format)."""
    value = check_content_format(value)
    if value != "auto":
        return value
    return detect_content_format(template) if isinstance(template, str) else "string"


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str) -> str:
    """"openai" when the template loops over a message's content (directly, through a filter such as
    selectattr, or through a variable set from it), else "string"; a template Jinja cannot parse is "string"
    (rendering it reports its error)."""
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    return "openai" if any(True for _ in content_loops(tree)) else "string"


def content_loops(tree: nodes.Template) -> Iterator[nodes.For]:
    """The `for` loops over a message's content: messages' names (`messages` and what is set from it), the
    loop variables over them, and the names set from their `content`."""
    messages = assigned_names(tree, {"messages"}, None)
    message_vars = {loop.target.name for loop in tree.find_all(nodes.For)
                    if isinstance(loop.target, nodes.Name) and reads(loop.iter, messages, None)}
    contents = assigned_names(tree, message_vars, "content")
    for loop in tree.find_all(nodes.For):
        if reads(loop.iter, message_vars, "content") or reads(loop.iter, contents, None):
            yield loop


def assigned_names(tree: nodes.Template, sources: set[str], key: str | None) -> set[str]:
    """Names `{% set x = ... %}` binds to a source name's value (its `key` item when given), and to those, in
    turn (the sources themselves included when key is None)."""
    found = set(sources) if key is None else set()
    grew = True
    while grew:
        grew = False
        for node in tree.find_all(nodes.Assign):
            if isinstance(node.target, nodes.Name) and node.target.name not in found and \
                    (reads(node.node, sources, key) or reads(node.node, found, None)):
                found.add(node.target.name)
                grew = True
    return found


def reads(node: nodes.Node, names: set[str], key: str | None) -> bool:
    """Whether an expression is one of names (or its `key` item: x['key'] or x.key), possibly through filters,
    tests and slices (`messages[1:]`, `message['content'] | selectattr(...)`)."""
    if isinstance(node, (nodes.Filter, nodes.Test)):
        return node.node is not None and reads(node.node, names, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return reads(node.node, names, key)
    if key is None:
        return isinstance(node, nodes.Name) and node.name in names
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == key and reads(node.node, names, None)
    return isinstance(node, nodes.Getattr) and node.attr == key and reads(node.node, names, None)
