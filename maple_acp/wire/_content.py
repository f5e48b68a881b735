"""Content blocks: what a prompt carries and what agent chunks and tool results show.

Every block is recognised on input, even the kinds the service refuses (image, audio, embedded
resources), so that a refusal can name the exact block instead of failing to parse it.
"""

from typing import Any, Literal

import attrs

#: ``_meta`` is ACP's reserved extension slot: carried verbatim, never interpreted here.
Meta = dict[str, Any]

Role = Literal["assistant", "user"]


@attrs.frozen(kw_only=True)
class Annotations:
    audience: tuple[Role, ...] | None = None
    last_modified: str | None = None
    priority: float | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class TextContent:
    text: str
    annotations: Annotations | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ImageContent:
    data: str
    mime_type: str
    uri: str | None = None
    annotations: Annotations | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AudioContent:
    data: str
    mime_type: str
    annotations: Annotations | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ResourceLink:
    name: str
    uri: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    annotations: Annotations | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class TextResourceContents:
    uri: str
    text: str
    mime_type: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class BlobResourceContents:
    uri: str
    blob: str
    mime_type: str | None = None
    meta: Meta | None = None


#: Told apart by which of ``text`` / ``blob`` is present (the schema gives them no tag).
ResourceContents = TextResourceContents | BlobResourceContents


@attrs.frozen(kw_only=True)
class EmbeddedResource:
    resource: ResourceContents
    annotations: Annotations | None = None
    meta: Meta | None = None


#: Tagged on ``type``: text, image, audio, resource_link, resource.
ContentBlock = TextContent | ImageContent | AudioContent | ResourceLink | EmbeddedResource
